#!/usr/bin/env python3
"""Prints every import circle between the files of a Rust crate; exit 1 if any.

For each crate under crates/ and for the root src/, one node per file: the
module path of the file (`report/model` for src/report/model.rs, `report`
for src/report.rs or src/report/mod.rs, `lib` for lib.rs and main.rs). A
path `crate::a::b::...` in file X (in a `use` or in code) makes an edge from
X to the longest module prefix of `a::b::...` that is a file, and
`super::...` does the same from the parent of X's module. `self::` and
plain relative paths are not followed: a file reaching its own children is
not a circle. A cycle is printed as `crate: a -> b -> a`.

Usage: import_cycles.py [ROOT ...]   (default: the repository's crates)
"""

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# `crate::` or a run of `super::`, then `ident::ident::...`; a `{` group is
# expanded by group_paths below.
PATH = re.compile(r"\b(crate|(?:super::)*super)::((?:[A-Za-z_][A-Za-z0-9_]*::)*(?:[A-Za-z_][A-Za-z0-9_]*|\{))")
# A raw string's opening (`r"`, `br#"`), with its hashes; a char literal
# (`'x'`, `'\n'`, `'\u{1F600}'`), not a lifetime (`'a`).
RAW_STRING = re.compile(r'\bb?r(#*)"')
CHAR = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^'\\\n])'")
INLINE_MOD = re.compile(r"\bmod\s+[A-Za-z_][A-Za-z0-9_]*\s*\{")


def crate_roots(repo):
    """The src/ folders to check: every crate under crates/, and the root's."""
    roots = sorted(p for p in (repo / "crates").glob("*/src") if p.is_dir())
    if (repo / "src").is_dir():
        roots.append(repo / "src")
    return roots


def module_of(src, path):
    """The module path of a file, as a tuple of names (() for the crate root)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts = parts[:-1]
    return tuple(parts)


def name(module):
    return "/".join(module) or "lib"


def strip_comments_and_strings(text):
    """The text with comments blanked and string and char literals emptied,
    so that neither can hold a path or a brace."""
    out, i, n = [], 0, len(text)
    while i < n:
        two = text[i : i + 2]
        if two == "//":
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif two == "/*":
            depth, i = 1, i + 2
            while i < n and depth:
                depth += {"/*": 1, "*/": -1}.get(text[i : i + 2], 0)
                i += 2 if text[i : i + 2] in ("/*", "*/") else 1
            out.append(" ")
        elif RAW_STRING.match(text, i):
            m = RAW_STRING.match(text, i)
            end = text.find('"' + m.group(1), m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif CHAR.match(text, i):
            i = CHAR.match(text, i).end()
            out.append("' '")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def group_paths(text, start):
    """The paths inside the `{...}` group that opens at text[start]."""
    depth, i = 0, start
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            break
        i += 1
    inner = text[start + 1 : i]
    # Only the first segment of each item matters for the target file when
    # the group sits at the crate root; deeper items are resolved in full.
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    out = []
    for item in items:
        item = item.strip()
        if not item or item.startswith("self"):
            continue
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)", item)
        if m:
            out.append(m.group(1).split("::"))
    return out


def inline_module_spans(text):
    """The (start, end) of the body of each inline `mod name { ... }`."""
    spans = []
    for m in INLINE_MOD.finditer(text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        spans.append((m.end(), i))
    return spans


def referenced_paths(text):
    """Every (anchor, segments, inline depth) of a `crate::`/`super::` path
    in the text; the depth counts the inline modules around the path, whose
    `super` is still this file."""
    spans = inline_module_spans(text)
    for m in PATH.finditer(text):
        anchor, rest = m.group(1), m.group(2)
        depth = sum(1 for a, b in spans if a <= m.start() < b)
        if rest.endswith("{"):
            prefix = [s for s in rest[:-1].split("::") if s]
            for tail in group_paths(text, m.end() - 1):
                yield anchor, prefix + tail, depth
        else:
            yield anchor, rest.split("::"), depth


def resolve(segments, modules):
    """The longest prefix of `segments` that is a module with a file."""
    for n in range(len(segments), 0, -1):
        if tuple(segments[:n]) in modules:
            return tuple(segments[:n])
    return None


def graph(src):
    """{module: set of modules it refers to} for the files under src."""
    files = {module_of(src, p): p for p in sorted(src.rglob("*.rs"))}
    edges = {m: set() for m in files}
    for module, path in files.items():
        text = strip_comments_and_strings(path.read_text(encoding="utf-8"))
        # A file's `super` is its module's parent (lib.rs has none); in an
        # inline module (`mod tests { use super::*; }`) it is the file.
        for anchor, segments, inline in referenced_paths(text):
            if anchor == "crate":
                base = ()
            else:
                ups = anchor.count("super") - inline
                if ups <= 0 or ups > len(module):
                    continue
                base = module[: len(module) - ups]
            target = resolve(list(base) + segments, files)
            if target is not None and target != module:
                edges[module].add(target)
    return edges


def cycles(edges):
    """Each elementary cycle once (Johnson-style search from each node,
    visiting only nodes ordered after it), as a list of modules."""
    order = sorted(edges)
    rank = {m: i for i, m in enumerate(order)}
    found = []
    for start in order:
        stack = [(start, iter(sorted(edges[start])))]
        path, on_path = [start], {start}
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                on_path.discard(path.pop())
                continue
            if nxt == start:
                found.append(list(path))
            elif nxt not in on_path and rank[nxt] > rank[start]:
                stack.append((nxt, iter(sorted(edges[nxt]))))
                path.append(nxt)
                on_path.add(nxt)
    return found


def crate_name(src):
    """The folder that holds `src`; the repository's own is `opdump`."""
    return "opdump" if src.resolve().parent == REPO else src.resolve().parent.name


def report(roots):
    """The cycle lines of every root, `crate: a -> b -> a`."""
    lines = []
    for src in roots:
        for c in cycles(graph(src)):
            lines.append(f"{crate_name(src)}: " + " -> ".join(name(m) for m in c + [c[0]]))
    return lines


def main(argv):
    roots = [Path(a) for a in argv] or crate_roots(REPO)
    lines = report(roots)
    for line in lines:
        print(line)
    if not lines:
        print(f"no import circle in {len(roots)} crate(s)")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
