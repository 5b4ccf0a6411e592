"""Count loose typing in the tree: ``Any`` on public signatures, ``Any`` in total, ``except Exception``.

The numbers issue 43 asks to see fall (or stated) between two commits:

- **public-signature Any**: occurrences of ``Any`` (``Any`` or ``typing.Any``, also inside string
  annotations) in the parameter and return annotations of public functions and methods in swarm/.
  Public means: the module path has no part starting with ``_`` (``__init__.py`` counts as its
  package), no enclosing class starts with ``_``, the function is not nested in another function, and
  its name does not start with ``_`` (dunders such as ``__init__`` and ``__call__`` are public).
- **total Any**: matches of the regex ``\\bAny\\b`` in swarm/**/*.py (comments and strings included,
  as a plain ``grep -w`` would count them).
- **except Exception**: handlers that catch ``Exception`` (alone or in a tuple) in swarm/, flows/,
  research_agent/ and experiments/, found with ``ast`` so comments and strings do not count.

It reads files only; it does not judge whether an ``Any`` is justified.

    .venv/bin/python tools/any_count.py [ROOT] [--by-file]
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["count_tree", "public_any", "except_exception"]

_ANY_WORD = re.compile(r"\bAny\b")
_EXCEPT_DIRS = ("swarm", "flows", "research_agent", "experiments")


def _any_in(node: ast.AST | None) -> int:
    """``Any`` mentions inside one annotation expression (string annotations parsed too)."""
    if node is None:
        return 0
    n = 0
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == "Any":
            n += 1
        elif isinstance(sub, ast.Attribute) and sub.attr == "Any":
            n += 1
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                n += _any_in(ast.parse(sub.value, mode="eval"))
            except SyntaxError:
                pass  # a Literal["..."] string, not an annotation
    return n


def _public_name(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _signature_any(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
    return sum(_any_in(p.annotation) for p in params) + _any_in(fn.returns)


def public_any(tree: ast.Module) -> int:
    """``Any`` in the signatures of the public functions and methods of one parsed module."""

    def visit(body: list[ast.stmt], in_public_class: bool = True) -> int:
        n = 0
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if in_public_class and _public_name(stmt.name):
                    n += _signature_any(stmt)
            elif isinstance(stmt, ast.ClassDef):
                n += visit(stmt.body, in_public_class and not stmt.name.startswith("_"))
            elif isinstance(stmt, (ast.If, ast.Try)):  # TYPE_CHECKING / optional-import blocks
                n += visit(stmt.body, in_public_class) + visit(stmt.orelse, in_public_class)
        return n

    return visit(tree.body)


def except_exception(tree: ast.Module) -> int:
    """Handlers in one parsed module that catch ``Exception`` (alone or in a tuple)."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            n += any(isinstance(t, ast.Name) and t.id == "Exception" for t in types)
    return n


def _public_module(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).with_suffix("").parts
    return not any(p.startswith("_") and p != "__init__" for p in parts)


def count_tree(root: Path) -> tuple[dict[str, int], dict[str, Counter[str]]]:
    """The three totals for the checkout at ``root``, and per-file counts for each."""
    by_file: dict[str, Counter[str]] = {"public_any": Counter(), "any": Counter(), "except_exception": Counter()}
    for path in sorted((root / "swarm").rglob("*.py")):
        rel = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8")
        by_file["any"][rel] = len(_ANY_WORD.findall(text))
        if _public_module(path, root):
            by_file["public_any"][rel] = public_any(ast.parse(text, filename=rel))
    for d in _EXCEPT_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            rel = str(path.relative_to(root))
            by_file["except_exception"][rel] = except_exception(ast.parse(path.read_text(encoding="utf-8"), filename=rel))
    totals = {k: sum(c.values()) for k, c in by_file.items()}
    return totals, by_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=".", type=Path, help="checkout to count (default: .)")
    ap.add_argument("--by-file", action="store_true", help="also list the files with the most of each")
    args = ap.parse_args(argv)
    totals, by_file = count_tree(args.root)
    print(f"public-signature Any (swarm/): {totals['public_any']}")
    print(f"total Any (swarm/):            {totals['any']}")
    print(f"except Exception ({', '.join(d + '/' for d in _EXCEPT_DIRS)}): {totals['except_exception']}")
    if args.by_file:
        for key, counts in by_file.items():
            print(f"\n{key}:")
            for rel, n in counts.most_common():
                if n:
                    print(f"  {n:4d}  {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
