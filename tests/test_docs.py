"""The documentation against the tree: every relative link and #anchor in
README.md, docs/ and the READMEs that point there resolves, the environment-variable reference lists
exactly the OPDUMP_* variables the sources read, and README.md stays short."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_BYTES = 15_000
ENV_PAGE = ROOT / "docs" / "reference" / "environment.md"

# Where the plugin, the loader, the build, the CLI and the Python package
# read their variables. tests/, crates/testkit, examples and benches are test
# or tool code, not the product; Rust unit tests (after `#[cfg(test)]`) use
# made-up names.
SOURCE_DIRS = ["build.rs", "src", "cpp", "crates", "python"]
SOURCE_SUFFIXES = {".rs", ".cpp", ".h", ".py"}
NOT_PRODUCT = ("tests", "testkit", "examples", "benches")
# Placeholders in help texts, not variables: `--set OPDUMP_NAME=VALUE`.
PLACEHOLDERS = {"OPDUMP_NAME"}

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A string literal that starts with a variable's name: "OPDUMP_DIR",
# 'OPDUMP_INPUTS=0'. Comments naming a variable do not count as reading it.
READ_NAME = re.compile(r"[\"'](OPDUMP(?:_[A-Z0-9]+)*)\b")


def markdown_files():
    pointers = [ROOT / "crates" / "cli" / "README.md", ROOT / "scripts" / "bench" / "README.md"]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *pointers]


def prose_lines(text):
    """The lines outside fenced code blocks, with inline code spans blanked,
    so that a link-like text in code is not taken for a link."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield re.sub(r"`+[^`]*`+", lambda m: " " * len(m.group()), line)


def github_slug(heading):
    """The anchor GitHub gives a heading: the rendered text (markup and
    links removed), lower-cased, punctuation other than '-' and '_' dropped,
    spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a Markdown file: heading slugs, with GitHub's -1, -2
    suffixes for repeated headings."""
    seen = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(md):
    """(line number, target, why) of each relative link in `md` that does
    not resolve."""
    out = []
    for lineno, line in enumerate(prose_lines(md.read_text()), 1):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (md.parent / unquote(path_part)).resolve() if path_part else md
            if not dest.exists():
                out.append((lineno, target, "no such file"))
            elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
                out.append((lineno, target, "no such heading"))
    return out


def source_text(path):
    text = path.read_text(errors="replace")
    if path.suffix == ".rs":
        text = text.split("#[cfg(test)]")[0]
    if path.name == "config.rs":
        # The table of names itself is what is checked, not a read.
        text = re.sub(r"pub const VARIABLES\b.*?\n\];", "", text, flags=re.S)
    return text


def variables_read():
    """Every OPDUMP_* name a product source file reads, with the files."""
    names = {}
    for entry in SOURCE_DIRS:
        base = ROOT / entry
        files = [base] if base.is_file() else sorted(base.rglob("*"))
        for f in files:
            rel = f.relative_to(ROOT).parts
            if f.suffix not in SOURCE_SUFFIXES or any(p in NOT_PRODUCT for p in rel):
                continue
            for m in READ_NAME.finditer(source_text(f)):
                names.setdefault(m.group(1), set()).add("/".join(rel))
    for p in PLACEHOLDERS:
        names.pop(p, None)
    return names


def documented_variables():
    rows = re.findall(r"^\| `(OPDUMP[A-Z0-9_]*)` \|", ENV_PAGE.read_text(), flags=re.M)
    assert rows, f"{ENV_PAGE} has no `| `OPDUMP_...` |` table rows"
    return rows


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(md):
    broken = broken_links(md)
    assert not broken, "\n".join(f"{md.relative_to(ROOT)}:{n}: {t} ({why})" for n, t, why in broken)


def test_every_variable_read_is_documented():
    documented = set(documented_variables())
    missing = {n: sorted(f) for n, f in variables_read().items() if n not in documented}
    assert not missing, f"read by the code but not in {ENV_PAGE.relative_to(ROOT)}: {missing}"


def test_every_documented_variable_is_read():
    read = variables_read()
    unread = [n for n in documented_variables() if n not in read]
    assert not unread, f"in {ENV_PAGE.relative_to(ROOT)} but read by no source: {unread}"


def test_each_variable_is_documented_once():
    rows = documented_variables()
    repeated = sorted({n for n in rows if rows.count(n) > 1})
    assert not repeated, f"listed more than once: {repeated}"


def test_readme_is_short():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; at most {README_MAX_BYTES}: move detail to docs/"


def test_slugs_follow_github():
    """The slug rules on headings this documentation uses, as GitHub renders
    them: the text as rendered, lower-cased, every character but letters,
    digits, spaces, "-" and "_" dropped, spaces turned into "-"."""
    assert github_slug("JSON (`--json`, and `DIR/compare.json`)") == "json---json-and-dircomparejson"
    assert github_slug("Scale: 1,000,000 and 10,000,000 op calls") == "scale-1000000-and-10000000-op-calls"
    assert github_slug("`opdump ranks`") == "opdump-ranks"
    assert github_slug("Fingerprint and sketch (OPDUMP_SKETCH)") == "fingerprint-and-sketch-opdump_sketch"


def readme_dependency_table():
    """{crate directory: set of crate names it uses} from the README's table
    after "Dependencies point one way"."""
    text = (ROOT / "README.md").read_text()
    block = text.split("Dependencies point one way", 1)[1].split("```", 2)[1]
    table = {}
    for line in block.strip().splitlines():
        where, _, uses = line.partition("→")
        uses = uses.strip().split("  ")[0]  # the comment after two spaces
        directory = where.split()[0].rstrip("/")
        table[directory] = set() if uses == "(none)" else {u.strip() for u in uses.split(",")}
    return table


def test_readme_crate_table_matches_cargo_metadata():
    """Each workspace crate, with exactly its normal dependencies on the
    other workspace crates, as `cargo metadata` reads the manifests."""
    import json
    import subprocess

    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    ours = {p["name"] for p in meta["packages"]}
    actual = {}
    for p in meta["packages"]:
        directory = str(Path(p["manifest_path"]).parent.relative_to(ROOT)) or "."
        directory = "src" if directory == "." else directory
        actual[directory] = {d["name"].removeprefix("opdump-") for d in p["dependencies"]
                             if d["name"] in ours and d["kind"] is None}
    assert readme_dependency_table() == actual


def test_readme_lists_every_cli_command():
    commands = {p.stem for p in (ROOT / "crates" / "cli" / "src" / "commands").glob("*.rs")}
    commands -= {"mod", "repro_check"}  # `repro --check` is repro's
    line = next(l for l in (ROOT / "README.md").read_text().splitlines() if l.startswith("crates/cli "))
    missing = [c for c in sorted(commands) if c not in line]
    assert not missing, f"README's crates/cli line lacks {missing}: {line}"
