"""The one seam to mlx-lm and mlx-vlm: every use of their private members lives in this package (see tests/fast/test_seam_contract.py)."""
