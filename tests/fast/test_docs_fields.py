"""The request and load fields are documented once: the tables of parsing/fields.py.

docs/FIELDS.md is generated from them; every field of backend.proto's PredictOptions and
ModelOptions has one row; a refused row is what params refuses (with the row's reason)
and an ignored row is accepted and unread; a field or Metadata key the code reads has a
row saying it is read; params.py's docstring no longer repeats the tables.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from helpers import ROOT

import backend_pb2 as pb
import params
from parsing import fields
from parsing.fields import MODEL_FIELDS, PREDICT_FIELDS, Field

PAGE = ROOT / "docs" / "FIELDS.md"
MESSAGES = [(pb.PredictOptions, PREDICT_FIELDS), (pb.ModelOptions, MODEL_FIELDS)]


def product_sources() -> dict[str, str]:
    """{path: text} of the product's Python files (not tests, bench, the table, the stubs)."""
    paths = [p for p in sorted(ROOT.glob("*.py")) if "pb2" not in p.name]
    for package in sorted(ROOT.glob("*/__init__.py")):
        if package.parent.name != "tests":
            paths += sorted(package.parent.rglob("*.py"))
    found = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in paths}
    del found["parsing/fields.py"]
    return found


def test_fields_page_is_generated_from_the_tables() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert fields.with_tables(text) == text, (
        "docs/FIELDS.md differs from parsing/fields.py and parsing/options.py: run "
        "`python -m parsing.fields docs/FIELDS.md`"
    )
    # Each field's row is there, with what unset means.
    for row in (*PREDICT_FIELDS, *MODEL_FIELDS):
        assert f"| {fields._names(row)} | {row.unset} | {fields._what(row)} |" in text


def test_the_generator_replaces_what_is_between_the_markers() -> None:
    stale = "".join(f"{b}| `Old` | x | y |\n{e}" for (b, e), _ in fields.TABLES.values())
    fresh = fields.with_tables("intro\n" + stale + "after\n")
    assert "`Old`" not in fresh and fresh.startswith("intro\n") and fresh.endswith("after\n")
    assert "| `Tokens` | option `max_tokens`, else 512 | max new tokens; capped at 32768" in fresh
    assert "| `max_batch_size` | integer ≥ 1 | 256 |" in fresh
    with pytest.raises(ValueError, match="PredictOptions table"):
        fields.with_tables("no markers here")


@pytest.mark.parametrize("message, rows", MESSAGES, ids=["PredictOptions", "ModelOptions"])
def test_every_proto_field_has_exactly_one_row(message, rows: tuple[Field, ...]) -> None:
    named = Counter(n for row in rows for n in row.names)
    assert [n for n, c in named.items() if c > 1] == []
    proto = {f.name for f in message.DESCRIPTOR.fields}
    assert set(named) == proto, (sorted(proto - set(named)), sorted(set(named) - proto))


def _set(message, name: str):
    """``message`` with field ``name`` set to a non-zero value of its type (1.0 is the
    "disabled" value of two refused samplers, so floats get 0.5)."""
    field = message.DESCRIPTOR.fields_by_name[name]
    value = {
        field.TYPE_STRING: "x",
        field.TYPE_BYTES: b"x",
        field.TYPE_BOOL: True,
        field.TYPE_FLOAT: 0.5,
        field.TYPE_DOUBLE: 0.5,
    }.get(field.type, 2)
    if field.message_type is not None:  # ModelOptions.Proxy: an empty message, set
        value = {}
    elif field.is_repeated:
        value = [value]
    return message(**({"Model": "m"} if message is pb.ModelOptions else {}), **{name: value})


def _parse(req):
    if isinstance(req, pb.ModelOptions):
        return params.load_params(req)
    return params.generation_params(req)


@pytest.mark.parametrize(
    "message, name, reason",
    [
        (m, n, row.does)
        for m, rows in MESSAGES
        for row in rows
        if row.status == "refused"
        for n in row.names
    ],
)
def test_a_refused_row_is_refused_with_its_reason(message, name, reason) -> None:
    label = message.DESCRIPTOR.name
    with pytest.raises(ValueError, match=re.escape(f"{label}.{name} is not supported on MLX")):
        _parse(_set(message, name))
    with pytest.raises(ValueError) as caught:
        _parse(_set(message, name))
    assert str(caught.value).endswith(reason)


@pytest.mark.parametrize(
    "message, name",
    [(m, n) for m, rows in MESSAGES for row in rows if row.status == "ignored" for n in row.names],
)
def test_an_ignored_row_is_accepted(message, name) -> None:
    assert _parse(_set(message, name)) is not None


def test_the_refusals_are_the_refused_rows() -> None:
    assert set(params._REFUSED_PREDICT) == {
        n for r in PREDICT_FIELDS if r.status == "refused" for n in r.names
    }
    assert set(params._REFUSED_LOAD) == {
        n for r in MODEL_FIELDS if r.status == "refused" for n in r.names
    }
    assert {"Mirostat", "Audios", "TypicalP"} <= set(params._REFUSED_PREDICT)
    assert {"LoraBase", "MMProj", "RopeScaling"} <= set(params._REFUSED_LOAD)


def test_what_the_code_reads_is_documented_as_read() -> None:
    sources = "\n".join(product_sources().values())
    proto = {f.name for m, _ in MESSAGES for f in m.DESCRIPTOR.fields}
    read_rows = {n for _, rows in MESSAGES for r in rows if r.status == "read" for n in r.names}
    # Attribute reads of a request (req.X, request.X) name read rows only.
    attrs = set(re.findall(r"\b(?:req|request)\.([A-Z]\w*)", sources)) & proto
    assert attrs, "the scan found no field reads"
    assert attrs <= read_rows, sorted(attrs - read_rows)
    # And every read row is read somewhere: as an attribute or by name (getattr(req, "Repeat")).
    unread = {n for n in read_rows if not re.search(rf'\.{n}\b|"{n}"', sources)}
    assert unread == set(), sorted(unread)


def test_the_metadata_keys_read_are_the_table() -> None:
    code = "\n".join(
        text
        for path, text in product_sources().items()
        if path == "params.py" or path.startswith("parsing/")
    )
    read = set(re.findall(r'etadata(?:\.get\(|\[)"(\w+)"', code))
    read |= set(re.findall(r'_metadata_choice\(req\.Metadata, load, "(\w+)"', code))
    assert read == {k.key for k in fields.METADATA_KEYS}


def test_params_docstring_points_at_the_tables_instead_of_repeating_them() -> None:
    doc = params.__doc__ or ""
    assert "`parsing/fields.py`" in doc and "docs/FIELDS.md" in doc
    # No row of a field table: "Tokens (4)   | ..." as the docstring once had.
    assert not re.search(r"^\w+ \(\d+\)\s+\|", doc, re.M)
    named = {n for row in (*PREDICT_FIELDS, *MODEL_FIELDS) for n in row.names}
    assert len({n for n in named if re.search(rf"\b{n}\b", doc)}) < 8
