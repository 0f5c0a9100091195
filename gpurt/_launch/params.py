"""Kernel parameter types, read from the kernel's declaration or its mangled name.

A launch converts each Python argument by the type the kernel DECLARES, so the launcher
needs the parameter list: for ``extern "C"`` kernels it is parsed from the source; for C++
kernels (templates, name expressions) from the Itanium-mangled lowered name, whose template
parameter references (``T_``) and substitutions (``S_``, ``S0_`` ...) are resolved here.
Parameter names, where the source has them, are only used in error messages.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Param", "CType", "kernel_params"]


@dataclasses.dataclass(frozen=True)
class CType:
    """A C type as far as argument passing cares: a pointer, a builtin scalar (by its
    Itanium code, e.g. ``f``), a class by name, or something unknown."""

    spelling: str
    kind: str  # 'pointer' | 'builtin' | 'class' | 'pack' | 'unknown'
    code: str = ""  # builtin code or class name
    items: tuple[CType, ...] = ()  # the types of a template parameter pack


@dataclasses.dataclass(frozen=True)
class Param:
    """One kernel parameter: position, declared name (may be ''), type and C layout.

    ``fmt`` is the ``struct`` code of one value ('' for byte blobs); ``size``/``align`` are
    0 when only the driver can tell (an unknown struct type)."""

    index: int
    name: str
    type: str
    kind: str  # 'pointer' | 'scalar' | 'bfloat16' | 'vector' | 'bytes'
    fmt: str
    size: int
    align: int

    def describe(self) -> str:
        label = f"{self.name}: {self.type}" if self.name else self.type
        return f"argument {self.index} ({label})"


# Itanium builtin type code -> (C spelling, struct format, size)
_BUILTINS: dict[str, tuple[str, str, int]] = {
    "b": ("bool", "?", 1),
    "c": ("char", "b", 1),
    "a": ("signed char", "b", 1),
    "h": ("unsigned char", "B", 1),
    "s": ("short", "h", 2),
    "t": ("unsigned short", "H", 2),
    "i": ("int", "i", 4),
    "j": ("unsigned int", "I", 4),
    "l": ("long", "q", 8),
    "m": ("unsigned long", "Q", 8),
    "x": ("long long", "q", 8),
    "y": ("unsigned long long", "Q", 8),
    "w": ("wchar_t", "i", 4),
    "f": ("float", "f", 4),
    "d": ("double", "d", 8),
    "Dh": ("half", "e", 2),
    "DF16_": ("_Float16", "e", 2),
    "Ds": ("char16_t", "H", 2),
    "Di": ("char32_t", "I", 4),
    "Du": ("char8_t", "B", 1),
    "v": ("void", "", 0),
    "Dn": ("nullptr_t", "Q", 8),
}

# C spellings (after dropping cv-qualifiers) -> Itanium code, including the usual typedefs.
_C_NAMES: dict[str, str] = {spelling: code for code, (spelling, _, _) in _BUILTINS.items()}
_C_NAMES.update({
    "signed": "i", "unsigned": "j", "signed int": "i", "short int": "s", "signed short": "s",
    "unsigned short int": "t", "long int": "l", "signed long": "l", "unsigned long int": "m",
    "long long int": "x", "signed long long": "x", "unsigned long long int": "y",
    "size_t": "m", "ptrdiff_t": "l", "intptr_t": "l", "uintptr_t": "m", "ssize_t": "l",
    "int8_t": "a", "uint8_t": "h", "int16_t": "s", "uint16_t": "t", "int32_t": "i",
    "uint32_t": "j", "int64_t": "l", "uint64_t": "m", "CUdeviceptr": "y",
})

# Class types passed by value that gpurt knows: name -> (kind, struct format, size, align).
_CLASSES: dict[str, tuple[str, str, int, int]] = {
    "__half": ("scalar", "e", 2, 2),
    "__nv_bfloat16": ("bfloat16", "H", 2, 2),
}
_CLASS_ALIASES = {"half": "__half", "nv_bfloat16": "__nv_bfloat16"}

# CUDA vector types: element name, struct code, element size.
_VECTOR_ELEMENTS = [
    ("char", "b", 1), ("uchar", "B", 1), ("short", "h", 2), ("ushort", "H", 2),
    ("int", "i", 4), ("uint", "I", 4), ("long", "q", 8), ("ulong", "Q", 8),
    ("longlong", "q", 8), ("ulonglong", "Q", 8), ("float", "f", 4), ("double", "d", 8),
]
for _elem, _code, _size in _VECTOR_ELEMENTS:
    for _n in (1, 2, 3, 4):
        _total = _size * _n
        _align = _size if _n == 3 else min(_total, 16)
        _CLASSES[f"{_elem}{_n}"] = ("vector", _code * _n, _total, _align)


def _layout(ctype: CType) -> tuple[str, str, int, int]:
    """(kind, struct format, size, align) of a by-value parameter of type ``ctype``."""
    if ctype.kind == "pointer":
        return ("pointer", "Q", 8, 8)
    if ctype.kind == "builtin" and ctype.code in _BUILTINS and _BUILTINS[ctype.code][2]:
        _, fmt, size = _BUILTINS[ctype.code]
        return ("scalar", fmt, size, size)
    if ctype.kind == "class":
        name = _CLASS_ALIASES.get(ctype.code, ctype.code)
        if name in _CLASSES:
            return _CLASSES[name]
    return ("bytes", "", 0, 0)


def make_param(index: int, name: str, ctype: CType) -> Param:
    kind, fmt, size, align = _layout(ctype)
    return Param(index, name, ctype.spelling, kind, fmt, size, align)


# ---- the declaration in the source (extern "C" kernels; names for templates) -------------

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_QUALIFIERS = re.compile(
    r"\b(const|volatile|__restrict__|__restrict|restrict|__grid_constant__|struct|class|"
    r"enum|typename|register)\b|__align__\s*\([^)]*\)|alignas\s*\([^)]*\)|\[\[.*?\]\]"
)
_IDENT = re.compile(r"[A-Za-z_]\w*$")
_FUNCTION_POINTER = re.compile(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)")
_TYPE_WORDS = {"unsigned", "signed", "int", "long", "short", "char", "float", "double", "bool",
               "void", "half"}


def _balanced(text: str, start: int) -> int:
    """Index just past the ')' matching the '(' at ``start``, or -1."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _split_top(text: str) -> list[str]:
    """Split a parameter list at commas outside (), <>, [] and {}."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def declared_params(source: str, name: str) -> list[tuple[str, str]] | None:
    """``[(type text, parameter name), ...]`` of the ``__global__`` function ``name`` in
    ``source`` (comments ignored), or None when no such declaration is found."""
    text = _COMMENTS.sub(" ", source)
    for match in re.finditer(rf"(?<![\w:]){re.escape(name)}\s*(<[^()]*>\s*)?\(", text):
        head = text[max(0, match.start() - 400): match.start()]
        head = re.split(r"[;{}#]", head)[-1]
        if "__global__" not in head:
            continue
        end = _balanced(text, match.end() - 1)
        if end < 0:
            return None
        inner = text[match.end(): end - 1].strip()
        if inner in ("", "void"):
            return []
        return [_split_param(p) for p in _split_top(inner)]
    return None


def _split_param(text: str) -> tuple[str, str]:
    """('float*', 'x') from 'const float* __restrict__ x = nullptr'."""
    text = _split_top(text.replace("=", ",", 1))[0] if "=" in text else text
    function_pointer = _FUNCTION_POINTER.search(text)
    if function_pointer:  # int (*fn)(int)
        name = function_pointer.group(1)
        return text.replace(function_pointer.group(0), "(*)"), name
    array = text.endswith("]")
    if array:
        text = text[: text.index("[")].rstrip()
    words = text.replace("*", " * ").replace("&", " & ").split()
    name = ""
    if len(words) > 1 and _IDENT.match(words[-1]) and words[-1] not in _TYPE_WORDS:
        name = words.pop()
    type_text = " ".join(words).replace(" *", "*").replace(" &", "&")
    if array:
        type_text += "*"
    return type_text, name


def ctype_from_text(text: str) -> CType:
    """Classify a C type spelling from a declaration."""
    spelling = " ".join(text.split())
    if "*" in spelling or "[" in spelling:
        return CType(spelling, "pointer")
    bare = " ".join(_QUALIFIERS.sub(" ", spelling).split())
    for prefix in ("::", "cuda::std::", "std::"):
        if bare.startswith(prefix) and bare[len(prefix):] in _C_NAMES:
            bare = bare[len(prefix):]
    if bare in _C_NAMES:
        return CType(spelling, "builtin", _C_NAMES[bare])
    if re.fullmatch(r"[A-Za-z_][\w:]*", bare):
        return CType(spelling, "class", bare.rsplit("::", 1)[-1])
    return CType(spelling, "unknown", bare)


# ---- Itanium C++ ABI mangled names ---------------------------------------------------------

_STD_ABBREV = {"a": "std::allocator", "b": "std::basic_string", "s": "std::string",
               "i": "std::istream", "o": "std::ostream", "d": "std::iostream"}


class _Demangler:
    """Just enough of the Itanium C++ ABI to list a function's parameter types."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.subs: list[CType] = []
        self.template_args: list[CType] = []

    def peek(self, n: int = 1) -> str:
        return self.s[self.i: self.i + n]

    def take(self, n: int = 1) -> str:
        out = self.s[self.i: self.i + n]
        if len(out) < n:
            raise ValueError("truncated mangled name")
        self.i += n
        return out

    def parameters(self) -> list[CType]:
        if self.take(2) != "_Z":
            raise ValueError("not a mangled name")
        is_template = self.function_name()
        if is_template:
            self.type()  # the return type comes first for templates
        params: list[CType] = []
        while self.i < len(self.s) and self.peek() != ".":
            param = self.type()
            params.extend(param.items if param.kind == "pack" else (param,))
        if len(params) == 1 and params[0].kind == "builtin" and params[0].code == "v":
            return []
        return params

    def source_name(self) -> str:
        digits = ""
        while self.peek().isdigit():
            digits += self.take()
        if not digits:
            raise ValueError(f"expected a name at {self.i}")
        return self.take(int(digits))

    def function_name(self) -> bool:
        """Parse the function's name; True when it carries template arguments."""
        if self.peek() == "N":
            _, args = self.nested(is_type=False)
        else:
            if self.peek(2) == "St":
                self.i += 2
            name = self.source_name()
            args = None
            if self.peek() == "I":
                self.subs.append(CType(name, "class", name))
                args = self.template_arguments()
        if args is None:
            return False
        self.template_args = args
        return True

    def nested(self, is_type: bool) -> tuple[str, list[CType] | None]:
        """``N ... E``: every proper prefix is a substitution candidate (and the whole name
        too when it names a type). Returns the name and its last template arguments."""
        self.take()  # N
        while self.peek() in ("K", "V", "r"):
            self.take()
        parts: list[str] = []
        last_args: list[CType] | None = None
        while self.peek() != "E":
            if self.peek() == "I":
                last_args = self.template_arguments()
                parts[-1] += "<...>"
            elif self.peek() == "S":
                parts.append(self.substitution().spelling)
                last_args = None
                if self.peek() != "E":
                    continue  # a substitution is not itself a new candidate
            elif self.peek() == "T":
                parts.append(self.template_param().spelling)
                last_args = None
            else:
                parts.append(self.source_name())
                last_args = None
            if self.peek() != "E" or is_type:
                name = "::".join(parts)
                self.subs.append(CType(name, "class", parts[-1].split("<")[0]))
        self.take()  # E
        return "::".join(parts), last_args

    def template_arguments(self) -> list[CType]:
        self.take()  # I
        args: list[CType] = []
        while self.peek() != "E":
            code = self.peek()
            if code == "L":
                args.append(self.literal())
            elif code == "X":
                self.skip_expression()
                args.append(CType("<expression>", "unknown"))
            elif code == "J":  # a parameter pack: one argument holding its types
                self.take()
                items = []
                while self.peek() != "E":
                    items.append(self.type())
                self.take()
                args.append(CType("...", "pack", items=tuple(items)))
            else:
                args.append(self.type())
        self.take()  # E
        return args

    def literal(self) -> CType:
        self.take()  # L
        if self.peek(2) == "_Z":
            depth = 1
            while depth:  # an encoded entity: skip to its matching E, roughly
                ch = self.take()
                depth += ch in "INLX"
                depth -= ch == "E"
            return CType("<entity>", "unknown")
        self.type()
        while self.peek() != "E":
            self.take()
        self.take()
        return CType("<literal>", "unknown")

    def skip_expression(self) -> None:
        depth = 0
        while True:
            ch = self.take()
            if ch in "XIL":
                depth += 1
            elif ch == "E":
                depth -= 1
                if depth == 0:
                    return

    def substitution(self) -> CType:
        self.take()  # S
        code = self.peek()
        if code == "t":
            self.take()
            name = "std::" + self.source_name()
            result = CType(name, "class", name)
            self.subs.append(result)
        elif code in _STD_ABBREV:
            self.take()
            result = CType(_STD_ABBREV[code], "class", _STD_ABBREV[code])
        else:
            seq = ""
            while self.peek() != "_":
                seq += self.take()
            self.take()
            index = 0 if not seq else int(seq, 36) + 1
            if index >= len(self.subs):
                raise ValueError(f"substitution S{seq}_ out of range")
            result = self.subs[index]
        if self.peek() == "I":
            self.template_arguments()
            result = CType(result.spelling + "<...>", "class", result.code)
            self.subs.append(result)
        return result

    def template_param(self) -> CType:
        self.take()  # T
        seq = ""
        while self.peek() != "_":
            seq += self.take()
        self.take()
        index = 0 if not seq else int(seq) + 1
        if index < len(self.template_args):
            result = self.template_args[index]
        else:
            result = CType(f"T{index}", "unknown")
        self.subs.append(result)
        if self.peek() == "I":
            self.template_arguments()
            result = CType(result.spelling + "<...>", "class", result.code)
            self.subs.append(result)
        return result

    def type(self) -> CType:
        code = self.peek()
        if code in _BUILTINS:
            self.take()
            return CType(_BUILTINS[code][0], "builtin", code)
        if code == "D":
            return self.d_type()
        if code in ("P", "R", "O"):
            self.take()
            inner = self.type()
            result = CType(inner.spelling + ("*" if code == "P" else "&"),
                           "pointer" if code == "P" else "unknown")
            self.subs.append(result)
            return result
        if code in ("K", "V", "r"):
            quals = ""
            while self.peek() in ("K", "V", "r"):
                quals += self.take()
            inner = self.type()
            words = " ".join(w for q, w in (("K", "const"), ("V", "volatile")) if q in quals)
            if inner.kind == "pointer":  # 'float* const', not 'const float*'
                spelling = f"{inner.spelling} {words}"
            else:
                spelling = f"{words} {inner.spelling}"
            result = dataclasses.replace(inner, spelling=spelling.strip())
            self.subs.append(result)
            return result
        if code == "T":
            return self.template_param()
        if code == "S":
            return self.substitution()
        if code == "N":
            name, _ = self.nested(is_type=True)
            return self.subs[-1] if self.subs else CType(name, "class", name)
        if code == "u":
            self.take()
            name = self.source_name()
            result = CType(name, "class", name)
            self.subs.append(result)
            return result
        if code == "F":
            self.take()
            while self.peek() != "E":
                self.type()
            self.take()
            result = CType("<function>", "unknown")
            self.subs.append(result)
            return result
        if code.isdigit():
            name = self.source_name()
            result = CType(name, "class", name)
            self.subs.append(result)
            if self.peek() == "I":
                self.template_arguments()
                result = CType(name + "<...>", "class", name)
                self.subs.append(result)
            return result
        raise ValueError(f"unsupported mangled type code {code!r} at {self.i}")

    def d_type(self) -> CType:
        if self.peek(3) == "DF1" and self.peek(5) == "DF16_":
            self.i += 5
            return CType("_Float16", "builtin", "DF16_")
        two = self.take(2)
        if two in _BUILTINS:
            return CType(_BUILTINS[two][0], "builtin", two)
        if two == "Dp":
            return self.type()
        raise ValueError(f"unsupported mangled type D{two[1:]}")


def mangled_params(lowered: str) -> list[CType] | None:
    """Parameter types of an Itanium-mangled function name, or None if it cannot be read."""
    try:
        return _Demangler(lowered).parameters()
    except (ValueError, IndexError):
        return None


def _base_name(expression: str) -> str:
    """'f' from 'ns::f<float, 128>' — the name to look up in the source."""
    head = expression.split("<", 1)[0].strip()
    return head.rsplit("::", 1)[-1]


def kernel_params(symbol: str, source: str | None, expression: str = "") -> list[Param] | None:
    """The parameters of kernel ``symbol`` (a lowered/mangled name or an extern "C" name)
    compiled from ``source``; ``expression`` is the user's name for it (for source names).
    None when the types cannot be determined (the launcher then relies on the driver)."""
    declared = declared_params(source, _base_name(expression or symbol)) if source else None
    if symbol.startswith("_Z"):
        types = mangled_params(symbol)
        if types is None:
            return None
        names = [n for _, n in declared] if declared and len(declared) == len(types) else []
        return [make_param(i, names[i] if names else "", t) for i, t in enumerate(types)]
    if declared is None:
        return None
    return [make_param(i, n, ctype_from_text(t)) for i, (t, n) in enumerate(declared)]
