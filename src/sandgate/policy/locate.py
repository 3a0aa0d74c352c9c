"""Where each key and value sits in a TOML file, so errors can name the line.

tomllib gives values but no positions; tree-sitter's TOML grammar gives a concrete syntax
tree with positions. We walk that tree once and record, for every path such as
``("profiles", "coder", "allow", 2, "port")``, the line and column where it is written.
Values themselves always come from tomllib: the tree is used for positions only.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from functools import lru_cache

import tree_sitter_toml
from tree_sitter import Language, Node, Parser

Path = tuple[str | int, ...]
Position = tuple[int, int]  # 1-based line, 1-based column

_KEY_NODES = {"bare_key", "quoted_key", "dotted_key"}


@lru_cache(maxsize=1)
def _parser() -> Parser:
    return Parser(Language(tree_sitter_toml.language()))


def locate(source: bytes) -> dict[Path, Position]:
    """Map every key path in ``source`` to the position where it is written."""
    tree = _parser().parse(source)
    return _Walker(source).walk(tree.root_node)


class Positions(Mapping[Path, Position]):
    """``locate(source)``, made when first asked: a file that loads without a problem never
    needs it, and walking the tree of 100,000 rules takes seconds (issue 11)."""

    def __init__(self, source: bytes) -> None:
        self._source = source
        self._found: dict[Path, Position] | None = None

    @property
    def _map(self) -> dict[Path, Position]:
        if self._found is None:
            self._found = locate(self._source)
        return self._found

    def __getitem__(self, path: Path) -> Position:
        return self._map[path]

    def __iter__(self) -> Iterator[Path]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)


def find(positions: Mapping[Path, Position], path: Path) -> Position | None:
    """Position of ``path``, or of its longest written prefix (pydantic adds type tags)."""
    for end in range(len(path), 0, -1):
        hit = positions.get(path[:end])
        if hit is not None:
            return hit
    return None


class _Walker:
    def __init__(self, source: bytes) -> None:
        self.source = source
        self.out: dict[Path, Position] = {}
        self.aot_count: dict[Path, int] = {}

    def walk(self, root: Node) -> dict[Path, Position]:
        for child in root.named_children:
            if child.type == "pair":
                self._pair(child, ())
            elif child.type == "table":
                self._table(child, array=False)
            elif child.type == "table_array_element":
                self._table(child, array=True)
        return self.out

    def _table(self, node: Node, *, array: bool) -> None:
        children = node.named_children
        if not children or children[0].type not in _KEY_NODES:
            return
        keys = list(self._keys(children[0]))
        prefix = (*self._resolve(keys[:-1]), keys[-1])
        self._mark(prefix, children[0])
        if array:
            index = self.aot_count.get(prefix, 0)
            self.aot_count[prefix] = index + 1
            prefix = (*prefix, index)
            self._mark(prefix, children[0])
        for child in children[1:]:
            if child.type == "pair":
                self._pair(child, prefix)

    def _resolve(self, keys: list[str]) -> Path:
        """A header's parent keys, with each array of tables replaced by its latest element."""
        path: Path = ()
        for key in keys:
            path = (*path, key)
            if path in self.aot_count:
                path = (*path, self.aot_count[path] - 1)
        return path

    def _pair(self, node: Node, prefix: Path) -> None:
        children = node.named_children
        if len(children) < 2:
            return
        key_node, value = children[0], children[-1]
        path = prefix + tuple(self._keys(key_node))
        self._mark(path, key_node)
        self._value(value, path)

    def _value(self, node: Node, path: Path) -> None:
        if node.type == "array":
            # Comments are named children too; they are not elements and must not shift indexes.
            items = [c for c in node.named_children if c.type != "comment"]
            for index, item in enumerate(items):
                self._mark((*path, index), item)
                self._value(item, (*path, index))
        elif node.type == "inline_table":
            for child in node.named_children:
                if child.type == "pair":
                    self._pair(child, path)

    def _keys(self, node: Node) -> Iterator[str]:
        if node.type == "dotted_key":
            for child in node.named_children:
                yield from self._keys(child)
        elif node.type == "quoted_key":
            text = self.source[node.start_byte : node.end_byte].decode()
            # Let the standard parser undo the quoting and escapes.
            yield next(iter(tomllib.loads(f"{text} = 0")))
        else:
            yield self.source[node.start_byte : node.end_byte].decode()

    def _mark(self, path: Path, node: Node) -> None:
        self.out.setdefault(path, (node.start_point[0] + 1, node.start_point[1] + 1))
