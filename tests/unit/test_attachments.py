"""A turn's attachments and output schema as the operator bounds them: images known by their
bytes, mislabeled and unreadable images refused, sizes and counts, names in the workspace,
schemas checked against their metaschema; the client's loading of real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.images import gif, jpeg, png, webp
from worker.client.workspace import load_attachments
from worker.errors import InvalidInput
from worker.options import attachments as checks
from worker.options.attachments import AttachmentLimits
from worker.options.output_schema import check_output_schema, read_output_schema
from worker.options.spec import RunOptions, TurnPayload, parse_options

LIMITS = AttachmentLimits(max_bytes=1000, max_files=3, max_total_bytes=1500)


@pytest.mark.parametrize(
    ("data", "media_type", "size"),
    [
        (png(3, 2), "image/png", (3, 2)),
        (jpeg(5, 4), "image/jpeg", (5, 4)),
        (gif(), "image/gif", (1, 1)),
        (webp(7, 6), "image/webp", (7, 6)),
    ],
    ids=["png", "jpeg", "gif", "webp"],
)
def test_each_image_type_is_known_by_its_bytes_and_its_header_read(
    data: bytes, media_type: str, size: tuple[int, int]
) -> None:
    assert checks.sniff(data) == media_type
    assert checks.image_size(data, media_type) == size
    # Named anything, or named as what it is: the bytes decide.
    assert checks.media_type("upload.bin", data) == media_type
    assert checks.media_type("noname", data) == media_type


def test_a_file_that_is_no_image_is_an_octet_stream() -> None:
    assert checks.sniff(b"just text\n") is None
    assert checks.media_type("notes.txt", b"just text\n") == checks.OCTET_STREAM
    assert checks.media_type("Makefile", b"all:\n") == checks.OCTET_STREAM


@pytest.mark.parametrize(
    ("name", "data", "found"),
    [
        ("photo.png", jpeg(), "a JPEG image"),
        ("photo.PNG", b"not an image at all", "not an image"),
        ("shot.jpg", png(), "a PNG image"),
        ("anim.gif", webp(), "a WebP image"),
        ("pic.webp", b"RIFF\x00\x00\x00\x00WAVEfmt ", "not an image"),
    ],
)
def test_a_file_named_as_an_image_whose_bytes_are_not_that_image_is_refused(
    name: str, data: bytes, found: str
) -> None:
    with pytest.raises(
        InvalidInput, match=rf"{name!r} is named as a .* image but its bytes are {found}"
    ):
        checks.media_type(name, data)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (png()[:16], "no PNG header"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "no JPEG frame header"),
        (b"\xff\xd8\xffX", "does not start with 0xFF|no JPEG frame header"),
        (b"GIF89a\x01", "cut short"),
        (b"RIFF\x10\x00\x00\x00WEBPXXXX", "no WebP frame header"),
        (png(0, 0), "0x0 pixels"),
    ],
    ids=["png-cut", "jpeg-no-sof", "jpeg-garbage", "gif-cut", "webp-unknown-chunk", "png-empty"],
)
def test_an_image_whose_header_cannot_be_read_is_refused_as_unreadable(
    data: bytes, why: str
) -> None:
    with pytest.raises(InvalidInput, match=rf"unreadable .* image: .*({why})"):
        checks.media_type("image", data)


def test_names_in_the_workspace_are_base_names_of_safe_characters_never_hidden() -> None:
    assert checks.safe_name("/home/me/shot 1.png") == "shot_1.png"
    assert checks.safe_name("..\\..\\evil.png") == "evil.png"
    assert checks.safe_name(".bashrc") == "bashrc"
    assert checks.safe_name("-rf") == "rf"
    assert checks.safe_name("...") == "attachment"
    assert checks.safe_name("résumé.pdf") == "r_sum_.pdf"
    assert len(checks.safe_name("x" * 300 + ".txt")) == 100
    assert checks.safe_name("x" * 300 + ".txt").endswith(".txt")


def test_the_bounds_name_the_file_and_the_setting() -> None:
    checks.check_count(3, LIMITS)
    with pytest.raises(InvalidInput, match=r"4 attachments.*limit of 3.*HARNESS_ATTACH_MAX_FILES"):
        checks.check_count(4, LIMITS)
    checks.check_size("a", 1000, 1000, LIMITS)
    with pytest.raises(InvalidInput, match=r"'a' is 1001 bytes.*HARNESS_ATTACH_MAX_BYTES"):
        checks.check_size("a", 1001, 1001, LIMITS)
    with pytest.raises(InvalidInput, match=r"HARNESS_ATTACH_MAX_TOTAL_BYTES"):
        checks.check_size("b", 600, 1600, LIMITS)
    with pytest.raises(InvalidInput, match=r"'c' is empty"):
        checks.check_size("c", 0, 0, LIMITS)
    with pytest.raises(InvalidInput, match=r"both be named 'x.png'"):
        checks.check_names(["x.png", "y", "x.png"])


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_the_client_loads_real_files_with_their_facts(tmp_path: Path) -> None:
    image = _write(tmp_path, "red.png", png())
    notes = _write(tmp_path, "my notes.txt", b"remember the milk\n")
    loaded = load_attachments([image, str(notes)], LIMITS)
    assert [(i.ref.name, i.ref.media_type, i.ref.size) for i in loaded] == [
        ("red.png", "image/png", len(png())),
        ("my_notes.txt", "application/octet-stream", 18),
    ]
    assert loaded[0].data == png()
    assert len(loaded[0].ref.sha256) == 64


def test_the_client_refuses_what_breaks_a_bound_before_anything_is_sent(tmp_path: Path) -> None:
    big = _write(tmp_path, "big.bin", b"x" * 1001)
    with pytest.raises(InvalidInput, match=r"'big.bin' is 1001 bytes"):
        load_attachments([big], LIMITS)
    small = [_write(tmp_path, f"f{i}.txt", b"x") for i in range(4)]
    with pytest.raises(InvalidInput, match=r"4 attachments"):
        load_attachments(small, LIMITS)
    halves = [_write(tmp_path, f"h{i}.bin", b"y" * 800) for i in range(2)]
    with pytest.raises(InvalidInput, match=r"HARNESS_ATTACH_MAX_TOTAL_BYTES"):
        load_attachments(halves, LIMITS)
    with pytest.raises(InvalidInput, match=r"cannot read the attachment .*missing.png"):
        load_attachments([tmp_path / "missing.png"], LIMITS)
    mislabeled = _write(tmp_path, "shot.png", jpeg())
    with pytest.raises(InvalidInput, match=r"'shot.png' is named as a PNG image"):
        load_attachments([mislabeled], LIMITS)
    cut = _write(tmp_path, "cut.png", png()[:20])
    with pytest.raises(InvalidInput, match=r"unreadable PNG image"):
        load_attachments([cut], LIMITS)
    with pytest.raises(InvalidInput, match=r"expected a list of file paths"):
        load_attachments(str(cut), LIMITS)  # type: ignore[arg-type]


def test_a_path_the_client_cannot_read_as_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(InvalidInput, match=r"cannot read the attachment .*folder.png"):
        load_attachments([tmp_path / "folder.png"], LIMITS)


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_a_valid_schema_is_taken_as_it_is() -> None:
    assert check_output_schema(SCHEMA, 10_000) == SCHEMA
    assert read_output_schema('{"type": "array"}', "'s.json'", 100) == {"type": "array"}


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (
            {"type": "objekt"},
            r"not a valid JSON Schema: 'objekt' is not valid under any .*\(at type\)",
        ),
        ({"required": "n"}, r"not a valid JSON Schema: 'n' is not of type 'array' \(at required\)"),
        (
            {"properties": {"n": {"minimum": "one"}}},
            r"'one' is not of type 'number' \(at properties/n/minimum\)",
        ),
        (True, "must be a JSON object .* not bool"),
        ([{"type": "object"}], "must be a JSON object .* not list"),
        ({"type": "string", "x": {1, 2}}, "is not JSON"),
    ],
    ids=["bad-type", "required-not-a-list", "nested", "boolean", "list", "not-json"],
)
def test_a_schema_that_is_not_a_schema_is_refused(schema: object, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        check_output_schema(schema, 10_000)


def test_a_schema_over_the_operators_bound_or_not_json_text_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"over the operator's limit of 20.*OUTPUT_SCHEMA_MAX"):
        check_output_schema(SCHEMA, 20)
    with pytest.raises(InvalidInput, match=r"the output schema 's.json' is not JSON"):
        read_output_schema("{type: object}", "'s.json'", 1000)


def test_the_run_options_and_the_turn_message_refuse_a_schema_that_is_not_a_schema() -> None:
    assert parse_options(harness="stdio-json", output_schema=SCHEMA).output_schema == SCHEMA
    with pytest.raises(InvalidInput, match=r"output_schema: the output schema is not a valid"):
        parse_options(harness="stdio-json", output_schema={"type": 7})
    with pytest.raises(ValueError, match=r"not a valid JSON Schema"):
        TurnPayload(run_id="r" + "0" * 24, turn=2, input="x", output_schema={"type": 7})
    assert "output_schema" in RunOptions.model_fields


def test_the_turn_message_names_each_attachment_by_facts_the_worker_checks() -> None:
    ref = {"name": "red.png", "size": 3, "sha256": "a" * 64, "media_type": "image/png"}
    payload = TurnPayload(run_id="r" + "0" * 24, turn=1, input="x", attachments=(ref,))
    assert payload.attachments[0].name == "red.png"
    for bad in ({"name": "../x"}, {"name": ".hidden"}, {"size": 0}, {"media_type": "text/html"}):
        with pytest.raises(ValueError):
            TurnPayload(run_id="r" + "0" * 24, turn=1, input="x", attachments=({**ref, **bad},))
