#!/usr/bin/env python3
"""Import circles between the source files of each crate: the house rule's check.

Every crate's modules point one way: no import circle of more than two files inside a crate, and
a pair that must know each other is named in ALLOWED_PAIRS with the reason. This reads each
crate's `src/` as text: a file is a module (`a.rs` or `a/mod.rs` is `a`, `a/b.rs` is `a::b`),
and a file imports another where its `use` declarations or inline paths name an item through
`crate::`, `super::` or `self::` that lives in that file (re-exports are followed: `crate::Error`
re-exported by `lib.rs` from `error.rs` is an import of `error.rs`). Declaring a child module and
re-exporting its items (`mod x; pub use x::Y;`) is the parent's facade, not an import. Tests
(`tests/`, `#[cfg(test)] mod tests` files) are left out: they may look anywhere.

Usage: scripts/module-cycles.py [--verbose] [CRATE_DIR...]   (default: crates/*, fuzz)
Exit status: 0 no circle beyond the allowed pairs, 1 circles found (listed on stdout), 2 usage.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Pairs of files (relative to the repository) that may import each other, with the reason.
ALLOWED_PAIRS: dict[frozenset[str], str] = {
    frozenset({"crates/gdpath-linux/src/mem.rs", "crates/gdpath-linux/src/shm.rs"}): (
        "a sealed memfd is one way host memory is allocated (mem's buffer owns its SharedBuf), "
        "and a peer's mapping of one is host memory like any other (shm returns a HostMem)"
    ),
    frozenset({"crates/gdpath-py/src/agent.rs", "crates/gdpath-py/src/blocks.rs"}): (
        "the Python API binds them both ways: Agent.prepare_blocks and transfer_blocks take "
        "KvLayouts, and KvLayout.from_tensor takes an Agent to register the tensor through"
    ),
}

# Files bigger than this are not source the project writes (bindgen output is read all the same).
MAX_FILE = 4 << 20
# How deep a chain of re-exports is followed before giving up on a name.
MAX_REEXPORT_HOPS = 16

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'b?r(#*)".*?"\1|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\'\\])\'', re.S)
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"\b(crate|super|self)((?:\s*::\s*\w+)+)")
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
CFG_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")


INLINE_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def strip(text: str) -> str:
    """Source text without comments, string literals (their words are not paths) and inline
    `#[cfg(test)] mod … { … }` blocks (tests may look anywhere)."""
    text = COMMENT.sub(" ", STRING.sub('""', text))
    out = []
    pos = 0
    for m in INLINE_TEST_MOD.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos : m.start()])
        depth = 1
        i = m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        pos = i
    out.append(text[pos:])
    return "".join(out)


def expand_use(tree: str) -> list[tuple[list[str], str | None]]:
    """The paths of one `use` tree: `a::{b, c::{d as e}}` -> [a,b], [a,c,d] (alias e)."""
    tree = re.sub(r"\s+", "", tree)
    out: list[tuple[list[str], str | None]] = []

    def walk(prefix: list[str], s: str) -> None:
        depth = 0
        start = 0
        parts = []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:i])
                start = i + 1
        parts.append(s[start:])
        for part in parts:
            if not part:
                continue
            brace = part.find("{")
            if brace >= 0 and part.endswith("}"):
                head = [p for p in part[:brace].split("::") if p]
                walk(prefix + head, part[brace + 1 : -1])
                continue
            alias = None
            if "as" in part and re.search(r"[\w*}]as\w", part):
                m = re.match(r"(.*?)as(\w+)$", part)
                if m and not m.group(1).endswith("::"):
                    part, alias = m.group(1), m.group(2)
            out.append((prefix + [p for p in part.split("::") if p], alias))

    walk([], tree)
    return out


class Crate:
    """One crate's module files, their re-exports and their imports of each other."""

    def __init__(self, root: Path, repo: Path):
        self.root = root
        self.repo = repo
        src = root / "src"
        self.files: dict[tuple[str, ...], Path] = {}
        self.test_files: set[Path] = set()
        entry = src / "lib.rs" if (src / "lib.rs").exists() else src / "main.rs"
        self._collect(entry, ())
        self.texts = {m: strip(p.read_text(errors="replace")[:MAX_FILE]) for m, p in self.files.items()}
        self.reexports = {m: self._reexports(m) for m in self.files}

    def _collect(self, path: Path, module: tuple[str, ...]) -> None:
        """Walks `mod x;` declarations from the crate root, as rustc finds the files."""
        if not path.exists():
            return
        self.files[module] = path
        raw = path.read_text(errors="replace")
        tests = set(CFG_TEST_MOD.findall(strip(raw)))
        if path.name in ("lib.rs", "main.rs", "mod.rs"):
            base = path.parent
        else:
            base = path.parent / path.stem
        for name in MOD_DECL.findall(strip(raw)):
            for cand in (base / f"{name}.rs", base / name / "mod.rs"):
                if cand.exists():
                    if name in tests:
                        self.test_files.add(cand)
                    else:
                        self._collect(cand, module + (name,))
                    break

    def _absolute(self, module: tuple[str, ...], path: list[str]) -> list[str] | None:
        """`path` as seen from `module`, from the crate root; None for other crates and std."""
        if not path:
            return None
        head, rest = path[0], path[1:]
        if head == "crate":
            return rest
        if head == "self":
            return list(module) + rest
        if head == "super":
            base = list(module)
            while path and path[0] == "super":
                if not base:
                    return None
                base.pop()
                path = path[1:]
            return base + path
        # A bare path in a `use` names a child module of this one (2018 edition) if one exists.
        if tuple(module) + (head,) in self.files:
            return list(module) + path
        return None

    def _reexports(self, module: tuple[str, ...]) -> dict[str, list[str]]:
        """Names this module re-exports (`pub use …`), mapped to the absolute path they name."""
        out: dict[str, list[str]] = {}
        for m in USE.finditer(self.texts[module]):
            if not m.group(1):
                continue
            for path, alias in expand_use(m.group(2)):
                absolute = self._absolute(module, path)
                if absolute is None or not absolute:
                    continue
                name = alias or absolute[-1]
                if name not in ("*", "self"):
                    out[name] = absolute
        return out

    def resolve(self, absolute: list[str], hops: int = 0) -> tuple[str, ...] | None:
        """The module file that defines the item `absolute` names (the longest module prefix,
        following that module's re-exports of the next name)."""
        best: tuple[str, ...] = ()
        for i in range(len(absolute), -1, -1):
            if tuple(absolute[:i]) in self.files:
                best = tuple(absolute[:i])
                break
        rest = absolute[len(best) :]
        if rest and hops < MAX_REEXPORT_HOPS:
            target = self.reexports.get(best, {}).get(rest[0])
            if target is not None and target[: len(best) + 1] != list(best) + [rest[0]]:
                return self.resolve(target + rest[1:], hops + 1)
        return best

    def edges(self) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
        """Each module file's imports of other module files of the crate."""
        graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in self.files}
        for module, text in self.texts.items():
            paths: list[list[str]] = []
            for m in USE.finditer(text):
                if m.group(1):
                    # A facade: a `pub use` of a child's items is the parent exposing them.
                    uses = [p for p, _ in expand_use(m.group(2))]
                    paths += [p for p in uses if not self._is_descendant(module, p)]
                else:
                    paths += [p for p, _ in expand_use(m.group(2))]
            body = USE.sub(" ", text)
            for m in INLINE.finditer(body):
                paths.append([m.group(1)] + [s for s in re.split(r"\s*::\s*", m.group(2)) if s])
            for path in paths:
                absolute = self._absolute(module, path)
                if absolute is None:
                    continue
                target = self.resolve(absolute)
                if target is not None and target != module and not self._is_ancestor(target, module):
                    graph[module].add(target)
        return graph

    def _is_descendant(self, module: tuple[str, ...], path: list[str]) -> bool:
        absolute = self._absolute(module, path)
        return absolute is not None and tuple(absolute[: len(module)]) == module and len(absolute) > len(module)

    @staticmethod
    def _is_ancestor(target: tuple[str, ...], module: tuple[str, ...]) -> bool:
        # A module naming an item its parent (or the crate root) defines is the parent's own
        # code, declared there; only a sibling or a descendant counts as an import.
        return len(target) < len(module) and module[: len(target)] == target

    def rel(self, module: tuple[str, ...]) -> str:
        return str(self.files[module].relative_to(self.repo))


def circles(graph: dict) -> list[list]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    out: list[list] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def main(argv: list[str]) -> int:
    verbose = "--verbose" in argv
    args = [a for a in argv if a != "--verbose"]
    if any(a.startswith("-") for a in args):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    repo = Path(__file__).resolve().parent.parent
    roots = [Path(a).resolve() for a in args] or sorted(
        p for p in [*repo.glob("crates/*"), repo / "fuzz"] if (p / "src").is_dir()
    )
    found = 0
    for root in roots:
        crate = Crate(root, repo)
        graph = crate.edges()
        for component in circles(graph):
            names = [crate.rel(m) for m in component]
            if len(names) == 2 and frozenset(names) in ALLOWED_PAIRS:
                if verbose:
                    print(f"allowed pair: {' <-> '.join(names)}: {ALLOWED_PAIRS[frozenset(names)]}")
                continue
            found += 1
            print(f"circle of {len(names)} files in {root.relative_to(repo)}:")
            members = set(component)
            for m in component:
                for t in sorted(graph[m] & members):
                    print(f"  {crate.rel(m)} -> {crate.rel(t)}")
    if found:
        print(f"module-cycles: {found} circle(s); break them or allow a pair with its reason")
        return 1
    print(f"module-cycles: no circle beyond the allowed pairs in {len(roots)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
