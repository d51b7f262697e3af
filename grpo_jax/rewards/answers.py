"""Finding the final answer in a completion and deciding whether it equals the reference.

Numbers are compared exactly (as fractions) first, so "1/2", "0.5", "\\frac{1}{2}" and "1,234" need
no symbolic machinery; anything else goes to math-verify (sympy) for symbolic equivalence, imported
only then (sympy is a heavy import, in memory and time: a regex reward never pays for it). These
functions have no timeout of their own: they run inside the reward worker processes, which do.
"""

import ast
import fractions
import operator
import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+|/\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def marked_answer(text: str) -> str | None:
    """The explicitly marked final answer: \\boxed{}, then <answer></answer>, then "#### ..."."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    hashes = _HASHES.findall(text)
    return hashes[-1].strip() if hashes else None


def extract_answer(text: str) -> str | None:
    """The marked answer if any, else the last number (integer, decimal or a/b) in the text: the
    usual GSM8K fallback."""
    marked = marked_answer(text)
    if marked is not None:
        return marked
    numbers = _NUMBER.findall(text)
    return numbers[-1].rstrip(",") if numbers else None


def to_fraction(text: str) -> fractions.Fraction | None:
    """Exact value of a plain number: integer, decimal, a/b, \\frac{a}{b}; commas, $ and a final
    period are ignored. None for anything else (expressions, units, words)."""
    s = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    s = s.removeprefix("\\left(").removesuffix("\\right)")
    frac = _FRAC.match(s)
    if frac:
        sign, num, den = frac.groups()
        s = f"{sign}{num}/{den}"
    try:
        return fractions.Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, reference: str) -> bool:
    """Exact numeric equality when both sides are plain numbers, else math-verify equivalence."""
    if predicted is None or not predicted.strip():
        return False
    p, r = to_fraction(predicted), to_fraction(reference)
    if p is not None and r is not None:
        return p == r
    import math_verify

    gold = math_verify.parse(f"${reference}$", parsing_timeout=None)
    pred = math_verify.parse(f"${predicted}$", parsing_timeout=None)
    return bool(gold and pred and math_verify.verify(gold, pred, timeout_seconds=None))


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> tuple[fractions.Fraction, list[int]]:
    """Exact value of an arithmetic expression (+ - * /, parentheses, non-negative integer literals,
    unary minus) and the integer literals it uses, in order. Raises ValueError on anything else,
    ZeroDivisionError on division by zero. Never calls eval."""
    if len(expression) > 200:  # bounded work for adversarial completions
        raise ValueError("expression too long")
    literals: list[int] = []

    def walk(node: ast.AST) -> fractions.Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
            return fractions.Fraction(node.value)
        raise ValueError(f"not allowed in an arithmetic expression: {ast.dump(node)}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression: {expression!r}") from e
    return walk(tree.body), literals
