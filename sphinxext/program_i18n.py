"""An example's program in another language: its messages, and the program rebuilt from their translations.

A Chinese rendering of each example is made from the English file and the example's
catalog (tools/program_messages.py). What a reader sees is translated; what the code
computes with is not:

* **comment**: a run of full-line comments in code (not in a gallery text block), one
  message per run (a bare ``#`` line ends a run), or a comment after code on its line;
* **docstring**: the docstring of a function or a class (the module's docstring is the
  page's title and introduction, translated with the page);
* **string**: a string constant that reads as prose (two words), or that a call shows
  (``print``, a figure's title, labels and text, ``label=``);
* **f-string**: the same for an f-string; its message is its source text between the
  quotes, replacement fields included, and the translation keeps the same fields.

A string is never a message where the code uses it as data: a dictionary key, an index,
an operand of a comparison, ``in`` or a ``match`` case, a keyword argument that an API
reads (``mode="max-autotune"``), an argument of a string method or of a file, process or
logger call (``DATA_CALLS``), or source code in a string; nor anywhere else in the file
where the same text is used so. A translation equal to its message keeps the original.

The invariant: the rendering's syntax tree equals the English one once every string
constant is masked, each f-string is reduced to its replacement fields (in any order)
and format specifications are kept (:func:`masked_tree`). Comments are not in the tree
at all. So the two programs run the same operations on the same values, and differ
only in their strings. That is not yet a proof that they print the same numbers: a
translated string that the code went on to compare or look up (through a variable, out
of the rules' sight) would change what runs. Equal messages get equal translations,
which keeps such comparisons between two translated strings intact; running the
Chinese programs is what settles the rest.
"""

import ast
import inspect
import io
import re
import string
import tokenize
import unicodedata
from dataclasses import dataclass

CONTEXT = "program"  # the catalog context of a program's messages
WIDTH = 88  # comments are wrapped to this many columns, a wide character counting two

TEXT_BLOCK_START = re.compile(r"^# ?%%")
SPECIAL_COMMENT = re.compile(r"^#\s*(sphinx_gallery_|noqa|type:|pragma|fmt:|-\*-|!)")
PROSE = re.compile(r"[A-Za-z]{2,}[,;:.!?'\")]*\s+[(\"'`]*[A-Za-z]{2,}")  # two words and a space
LETTERS = re.compile(r"[A-Za-z]{2,}")
# Calls whose string arguments a reader sees, and keyword arguments that are labels.
SHOWN_BY = {"print", "set_title", "set_xlabel", "set_ylabel", "suptitle", "title", "xlabel",
            "ylabel", "text", "annotate", "figtext", "legend", "set_xticklabels",
            "set_yticklabels", "bar_label", "skip", "fail", "warn"}
LABEL_KEYWORDS = {"label", "labels", "title", "xlabel", "ylabel", "msg", "message"}
# Calls that compute with a string passed to them: string methods, lookups, files, processes,
# loggers and warning filters, operator names, and this course's output-searching helpers.
DATA_CALLS = {"startswith", "endswith", "count", "find", "rfind", "index", "split", "rsplit",
              "partition", "rpartition", "replace", "strip", "lstrip", "rstrip", "removeprefix",
              "removesuffix", "search", "match", "fullmatch", "findall", "finditer", "sub",
              "compile", "get", "pop", "setdefault", "getattr", "setattr", "hasattr", "getenv",
              "open", "Path", "write_text", "read_text", "getLogger", "filterwarnings",
              "simplefilter", "custom_op", "triton_op", "run", "Popen", "check_output",
              "encode", "decode", "first_line_with", "median_seconds", "timeit", "Timer"}


class ProgramTranslationError(ValueError):
    """A translation that cannot make a program equal to the original."""


@dataclass(frozen=True)
class Message:
    kind: str  # comment, docstring, string, f-string
    msgid: str
    line: int  # 1-based line of the English file


# -- Display width ----------------------------------------------------------------------

def display_width(text):
    """Columns a terminal gives ``text``: two for a wide (East Asian) character."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


# -- What is a message --------------------------------------------------------------------

def _parents(tree):
    parent = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parent[child] = node
    return parent


def _docstrings(tree):
    """The docstring constants of functions and classes, and the module's."""
    module, others = None, set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                if isinstance(node, ast.Module):
                    module = body[0].value
                else:
                    others.add(body[0].value)
    return module, others


def _call_name(call):
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _used_as_data(node, parent):
    """Whether the code computes with this string (rather than showing it)."""
    up = parent.get(node)
    while isinstance(up, (ast.Tuple, ast.List, ast.Set)):  # an element of a literal collection
        node, up = up, parent.get(up)
    if isinstance(up, ast.Dict) and any(k is node for k in up.keys):
        return True
    if isinstance(up, ast.Subscript) and up.slice is node:
        return True
    if isinstance(up, (ast.Compare, ast.match_case, ast.MatchValue)):
        return True
    if isinstance(up, ast.keyword):
        return up.arg not in LABEL_KEYWORDS  # loc="upper left", mode="max-autotune"
    if isinstance(up, ast.Call) and node is not up.func:
        name = _call_name(up)
        if name == "write":  # sys.stdout.write shows; a file's write stores
            return ast.unparse(up.func) not in {"sys.stdout.write", "sys.stderr.write"}
        return name in DATA_CALLS
    return False


def _shown(node, parent):
    """Whether a call shows this string: an argument of print, a figure's text, a label."""
    up = parent.get(node)
    while isinstance(up, (ast.Tuple, ast.List, ast.BinOp, ast.IfExp)) or (
            isinstance(up, ast.Call) and _call_name(up) in {"join", "format"}):
        node, up = up, parent.get(up)
    if isinstance(up, ast.keyword):
        return up.arg in LABEL_KEYWORDS
    return isinstance(up, ast.Call) and _call_name(up) in SHOWN_BY and node is not up.func


def _segment_lines(source):
    return source.splitlines(keepends=True)


def _char_offset(lines, lineno, col_bytes):
    """Character offset in the file of an AST position (``col_offset`` counts UTF-8 bytes)."""
    line = lines[lineno - 1]
    return sum(len(x) for x in lines[: lineno - 1]) + len(line.encode("utf-8")[:col_bytes].decode("utf-8"))


def _span(lines, node):
    return (_char_offset(lines, node.lineno, node.col_offset),
            _char_offset(lines, node.end_lineno, node.end_col_offset))


STRING_PIECE = re.compile(r"""(?P<prefix>[rRbBuUfF]{0,2})(?P<quote>'''|\"\"\"|'|")""")


def _pieces(text):
    """The string literals an (implicitly concatenated) string expression is made of:
    (prefix, quote, body) each. Code that parses on Python 3.11 never nests a quote inside
    an f-string's field, so a literal ends at the first unescaped copy of its quote."""
    pieces, i = [], 0
    while i < len(text):
        if text[i] in " \t\r\n\\":
            i += 1
            continue
        if text[i] == "#":
            i = text.index("\n", i) if "\n" in text[i:] else len(text)
            continue
        match = STRING_PIECE.match(text, i)
        if not match:
            raise ProgramTranslationError(f"not a string literal: {text[i:i + 40]!r}")
        prefix, quote = match["prefix"], match["quote"]
        j = match.end()
        while not text.startswith(quote, j):  # a backslash keeps the next quote in, raw or not
            if j >= len(text):
                raise ProgramTranslationError(f"unterminated string literal: {text[:60]!r}")
            j += 2 if text[j] == "\\" else 1
        pieces.append((prefix, quote, text[match.end():j]))
        i = j + len(quote)
    return pieces


def fstring_message(source_text):
    """An f-string expression's message: the bodies of its literals, as f-string source."""
    bodies = []
    for prefix, quote, body in _pieces(source_text):
        if "r" in prefix.lower() or len(quote) == 3:
            raise ProgramTranslationError(f"raw or triple-quoted f-string pieces are not handled: {source_text[:60]!r}")
        if "f" not in prefix.lower():
            body = body.replace("{", "{{").replace("}", "}}")
        other = '"' if quote == "'" else "'"
        bodies.append(body.replace("\\" + other, other))  # one quote style for the message
    return "".join(bodies)


def _strings(tree, source):
    """(node, kind, msgid) of every string or f-string message, in file order."""
    parent = _parents(tree)
    module_doc, docstrings = _docstrings(tree)
    lines = _segment_lines(source)
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in ast.walk(n) if v is not n}
    candidates, data_texts = [], set()
    for node in ast.walk(tree):
        if id(node) in in_fstring or node is module_doc or node in docstrings:
            continue
        if not (isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        start, end = _span(lines, node)
        pieces = _pieces(source[start:end])
        long_form = any(len(quote) == 3 or "r" in prefix.lower() for prefix, quote, _ in pieces)
        if long_form and (isinstance(node, ast.JoinedStr) or not _shown(node, parent)):
            continue  # a triple-quoted or raw literal is code (a kernel's source, a script), not a message
        if isinstance(node, ast.Constant):
            text, kind = node.value, "string"
        else:
            text, kind = fstring_message(source[start:end]), "f-string"
        if _used_as_data(node, parent):
            data_texts.add(text)
        elif LETTERS.search(_literal_text(node) if kind == "f-string" else text) and (
                PROSE.search(_with_fields_as_words(text) if kind == "f-string" else text)
                or _shown(node, parent)):
            candidates.append((node, kind, text))
    kept = [c for c in candidates if c[2] not in data_texts and not _is_code(c[2], c[1] == "f-string")]
    return sorted(kept, key=lambda c: (c[0].lineno, c[0].col_offset))


C_SOURCE = re.compile(r"#include|__global__|\bat::|\)\s*\{|;\s*\}")


def _is_code(text, fstring=False):
    """Whether a string is source code (a script run in a subprocess, a C++ probe), not prose."""
    literal = re.sub(r"\{[^{}]*\}", "x", text) if fstring else text
    if C_SOURCE.search(literal):
        return True
    try:
        tree = ast.parse(re.sub(r"\{[^{}]*\}", "x", text))
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(node, (ast.Import, ast.ImportFrom)) or isinstance(node, ast.Call)
               and isinstance(node.func, ast.Attribute) for node in ast.walk(tree))  # x.f(...): code


def _with_fields_as_words(body):
    """An f-string's text with each field read as a word: "step {k}, rank {r}" is prose."""
    return re.sub(r"\{[^{}]*\}", "Xx", body.replace("{{", "").replace("}}", ""))


def _literal_text(joined):
    """An f-string's own text: its literal parts and the labels of its label fields."""
    return " ".join(v.value if isinstance(v, ast.Constant) else v.value.value
                    for v in joined.values if isinstance(v, ast.Constant) or is_label_field(v))


def is_label_field(node):
    """A replacement field that formats a string constant, such as a table's column header
    ``{'time ms':>9}``: it computes nothing, so its text and its width are the message's,
    and a translation may change both (a wide character takes two columns)."""
    return (isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str) and node.conversion == -1
            and (node.format_spec is None or all(isinstance(v, ast.Constant) for v in node.format_spec.values)))


def _label_spec(node):
    return "".join(v.value for v in node.format_spec.values) if node.format_spec else ""


def label_fields(fstring_body):
    """The (label, format spec) of each label field of an f-string message, in order."""
    tree = _fstring_tree(fstring_body)
    if not isinstance(tree, ast.JoinedStr):
        return []
    return [(v.value.value, _label_spec(v)) for v in tree.values if is_label_field(v)]


def label_width_problems(msgid, msgstr):
    """Label fields of a translation that print wider or narrower than the original's, in
    display columns: ``{'time ms':>9}`` takes 9 columns, so its translation must too."""
    problems = []
    for (en, en_spec), (zh, zh_spec) in zip(label_fields(msgid), label_fields(msgstr)):
        try:
            want, got = display_width(format(en, en_spec)), display_width(format(zh, zh_spec))
        except ValueError as error:
            problems.append(f"{{{zh!r}:{zh_spec}}}: {error}")
            continue
        if got != want and display_width(zh) <= want:
            fix = re.sub(r"\d+", str(want - (display_width(zh) - len(zh))), en_spec, count=1)
            problems.append(f"{{{zh!r}:{zh_spec}}} takes {got} columns and {{{en!r}:{en_spec}}}"
                            f" {want}: write {{{zh!r}:{fix}}}")
        elif got != want:
            problems.append(f"{zh!r} is wider than its column, {{{en!r}:{en_spec}}}: {want} columns")
    if not problems and _only_labels(msgid):  # a header: the spaces between its labels count too
        want, got = display_width(_as_printed(msgid)), display_width(_as_printed(msgstr))
        if want != got:
            problems.append(f"the header takes {got} columns and the original {want}: keep its spaces")
    return problems


def _only_labels(fstring_body):
    """Whether an f-string holds only label fields and spaces: a table's header."""
    tree = _fstring_tree(fstring_body)
    return isinstance(tree, ast.JoinedStr) and all(
        is_label_field(v) or isinstance(v, ast.Constant) and not v.value.strip() for v in tree.values)


def _as_printed(fstring_body):
    """What a header prints (its fields are all labels)."""
    tree = _fstring_tree(fstring_body)
    return "".join(v.value if isinstance(v, ast.Constant) else format(v.value.value, _label_spec(v))
                   for v in tree.values)


def _text_block_lines(lines):
    """Line numbers (1-based) of the gallery's text blocks: a ``# %%`` line and the comment
    lines that follow it."""
    inside, found = False, set()
    for number, line in enumerate(lines, 1):
        if TEXT_BLOCK_START.match(line):
            inside = True
        elif not line.startswith("#"):
            inside = False
        if inside:
            found.add(number)
    return found


def _comments(source):
    """(first line, last line, column, msgid, inline) of every comment message."""
    lines = _segment_lines(source)
    text_lines = _text_block_lines(lines)
    runs, current = [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        number, column = token.start
        if number in text_lines or SPECIAL_COMMENT.match(token.string):
            current = None
            continue
        text = token.string[1:].strip()
        inline = bool(lines[number - 1][:column].strip())
        if inline:
            runs.append([number, number, column, [text], True])
            current = None
        elif not text:
            current = None
        elif current and current[1] == number - 1 and current[2] == column:
            current[1] = number
            current[3].append(text)
        else:
            current = [number, number, column, [text], False]
            runs.append(current)
    return [(a, b, col, " ".join(texts), inline) for a, b, col, texts, inline in runs
            if LETTERS.search(" ".join(texts))]


def messages(source):
    """Every message of a program, in file order."""
    tree = ast.parse(source)
    found = [Message("comment", text, first) for first, _, _, text, _ in _comments(source)]
    _, docstrings = _docstrings(tree)
    found += [Message("docstring", inspect.cleandoc(d.value), d.lineno) for d in docstrings]
    found += [Message(kind, text, node.lineno) for node, kind, text in _strings(tree, source)]
    return sorted(found, key=lambda m: m.line)


# -- The program in another language ---------------------------------------------------------

WIDE = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f"
TOKEN = re.compile(f"[{WIDE}]|[^\\s{WIDE}]+|\\s+")
NO_LINE_START = set("，。、；：！？）」』》】〉…%")  # Chinese line-breaking rules (kinsoku)
NO_LINE_END = set("（「『《【〈")


def _breakable(tokens, i):
    """Whether a line may end before ``tokens[i]``."""
    before, after = tokens[i - 1], tokens[i]
    return not (after[0] in NO_LINE_START or before[-1] in NO_LINE_END or before.endswith("\\"))


def _lines_of(text, width, tokens=None, lossless=False):
    """Lines of at most ``width`` display columns, broken at spaces or between wide
    characters, never before a closing or after an opening Chinese punctuation mark.
    ``lossless``: the lines join back to the text (a string split into literals)."""
    tokens = tokens or TOKEN.findall(text)
    out, line = [], []
    for i, token in enumerate(tokens):
        if line and display_width("".join(line) + token) > width and "".join(line).strip() \
                and _breakable(tokens, i):
            out.append("".join(line))
            line = [token] if lossless or not token.isspace() else []
        else:
            line.append(token)
    if "".join(line).strip():
        out.append("".join(line))
    return out


def _wrap(text, width):
    """A comment's lines: words and wide characters, spaces folded, no trailing space."""
    tokens = [" " if t.isspace() else t for t in TOKEN.findall(text)]
    return [line.strip() for line in _lines_of(text, width, tokens)]


def _fstring_tokens(body):
    """Tokens of an f-string's source text, each field (with its braces) one token."""
    tokens, i = [], 0
    while i < len(body):
        if body.startswith(("{{", "}}"), i):
            tokens.append(body[i:i + 2])
            i += 2
        elif body[i] == "{":
            depth, j = 0, i
            while True:
                depth += {"{": 1, "}": -1}.get(body[j], 0)
                j += 1
                if depth == 0 or j >= len(body):
                    break
            tokens.append(body[i:j])
            i = j
        elif body[i] == "\\":
            tokens.append(body[i:i + 2])
            i += 2
        else:
            match = TOKEN.match(body, i)
            text = match.group()
            cut = min([k for k in (text.find("{"), text.find("\\")) if k > 0], default=len(text))
            tokens.append(text[:cut])
            i += cut
    return tokens


def _quote_string(text, quote):
    """A string literal holding ``text``, in the original's quote style where it can."""
    literal = repr(text)
    if quote in ('"', '"""') and literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def _fstring_literal(body, quote):
    q = quote if quote in ("'", '"') else '"'
    fields = re.findall(r"\{[^{}]*\}", body.replace("{{", "").replace("}}", ""))
    if q in body.replace("\\" + q, "") and not any(q in f for f in fields):
        body = re.sub(r"(?<!\\)" + re.escape(q), "\\" + q, body)
    return "f" + q + body + q


def _literals(msgstr, kind, quote, column, joiner):
    """The source of a translated string: one literal, or where the original ran over
    several lines, literals of at most WIDTH columns from ``column`` on, joined by ``joiner``."""
    width = max(20, WIDTH - column - 4)
    if kind == "f-string":
        pieces = _lines_of(msgstr, width, _fstring_tokens(msgstr), lossless=True) if joiner else [msgstr]
        return joiner.join(_fstring_literal(piece, quote) for piece in pieces)
    pieces = _lines_of(msgstr, width, TOKEN.findall(msgstr), lossless=True) if joiner else [msgstr]
    pieces = [p for p in pieces if p] or [""]
    if joiner and "\n" in msgstr:  # a new line in the text ends its literal, as in the original
        pieces = [q for p in pieces for q in re.split(r"(?<=\n)", p) if q]
    return joiner.join(_quote_string(piece, quote) for piece in pieces)


def format_fields(text):
    """The str.format fields of a plain string (for "{}.{}".format(...)), or [] if it has none."""
    try:
        return sorted((f, s, c) for _, f, s, c in string.Formatter().parse(text) if f is not None)
    except ValueError:
        return []


def _fstring_tree(fstring_body):
    try:
        tree = ast.parse("f" + repr(fstring_body)[0] + fstring_body + repr(fstring_body)[0], mode="eval")
    except SyntaxError:
        tree = ast.parse('f"""' + fstring_body + '"""', mode="eval")
    return tree.body


def fields(fstring_body):
    """The replacement fields of an f-string message, as the parser reads them; a label
    field counts as a label, whatever its text and width (:func:`is_label_field`)."""
    tree = _fstring_tree(fstring_body)
    if not isinstance(tree, ast.JoinedStr):
        return []
    return sorted("label" if is_label_field(v) else ast.dump(v)  # sorted: a translation may
                  for v in tree.values if isinstance(v, ast.FormattedValue))  # reorder them


def _prefix(fstring_body):
    """The text an f-string prints before its first field, or None."""
    match = re.match(r"((?:[^{]|\{\{)*)\{(?!\{)", fstring_body)
    return match[1].replace("{{", "{") if match else None


def label_column_groups(messages):
    """Runs of f-string messages on consecutive lines whose English pads a label so that
    the values line up ("CPU           : {cpu}" over "torch threads : {n}"): their values
    start at one column, and so must their translations'."""
    groups, current = [], []
    for message in (m for m in messages if m.kind == "f-string"):  # a comment on the line is no break
        prefix = _prefix(message.msgid)
        aligned = prefix is not None and re.search(r"\S\s*:\s*$", prefix)
        if aligned and current and message.line == current[-1].line + 1 \
                and display_width(prefix) == display_width(_prefix(current[-1].msgid)):
            current.append(message)
            continue
        if len(current) > 1 and any("  " in _prefix(m.msgid) for m in current):
            groups.append(current)
        current = [message] if aligned else []
    if len(current) > 1 and any("  " in _prefix(m.msgid) for m in current):
        groups.append(current)
    return groups


def label_column_problems(source, translations):
    """Padded labels whose translations no longer line their values up, in display columns."""
    problems = []
    for group in label_column_groups(messages(source)):
        texts = [translations.get(m.msgid) or m.msgid for m in group]
        columns = [display_width(_prefix(t) or "") for t in texts]
        if len(set(columns)) > 1:
            problems.append(f"line {group[0].line}: values start at columns {columns} in the translations of "
                            + ", ".join(repr(m.msgid[:30]) for m in group) + "; pad each label to one width"
                            " (a Chinese character takes two columns)")
    return problems


def translate(source, translations, *, strict=True):
    """The program with every message replaced by its translation (``translations``:
    msgid -> msgstr; an empty msgstr, or one equal to its msgid, keeps the original).
    ``strict``: a message without an entry is an error, naming it."""
    tree = ast.parse(source)
    lines = _segment_lines(source)
    missing, edits = [], []  # edits: (start, end, replacement) in character offsets

    def lookup(msgid, line):
        if msgid not in translations:
            missing.append(f"line {line}: {msgid[:70]!r}")
            return None
        msgstr = translations[msgid]
        return None if not msgstr or msgstr == msgid else msgstr

    for first, last, column, text, inline in _comments(source):
        if (msgstr := lookup(text, first)) is None:
            continue
        line = lines[first - 1]
        if inline and display_width(line[:column] + "# " + msgstr) <= WIDTH:
            start = _char_offset(lines, first, 0) + column
            end = _char_offset(lines, first, 0) + len(line.rstrip("\r\n"))
            edits.append((start, end, "# " + msgstr))
        elif inline:  # too long after its code: the comment goes on the lines above it
            code = line[:column].rstrip()
            indent = code[: len(code) - len(code.lstrip())]
            wrapped = _wrap(msgstr, WIDTH - display_width(indent) - 2)
            start = _char_offset(lines, first, 0)  # two edits, so that the code's own strings are
            edits.append((start, start, "".join(f"{indent}# {w}\n" for w in wrapped)))  # edited too
            edits.append((start + len(code), start + len(line.rstrip("\r\n")), ""))
        else:
            indent = line[:column]
            wrapped = _wrap(msgstr, WIDTH - display_width(indent) - 2)
            start = _char_offset(lines, first, 0)
            end = _char_offset(lines, last, 0) + len(lines[last - 1])
            edits.append((start, end, "".join(f"{indent}# {w}\n" for w in wrapped)))

    _, docstrings = _docstrings(tree)
    for node in docstrings:
        if (msgstr := lookup(inspect.cleandoc(node.value), node.lineno)) is None:
            continue
        start, end = _span(lines, node)
        original = source[start:end]
        prefix = re.match(r"[rRuU]?", original).group()
        indent = " " * (len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip()))
        body = msgstr.split("\n")
        if len(body) == 1 and "\n" not in original:
            text = f'{prefix}"""{msgstr}"""'
        else:
            text = f'{prefix}"""' + body[0] + "".join("\n" + (indent + b if b else "") for b in body[1:])
            text += f"\n{indent}\"\"\"" if original.rstrip('"').endswith("\n" + indent) else '"""'
        if "\\" in msgstr and not prefix:
            text = "r" + text if "r" not in prefix else text
        edits.append((start, end, text))

    for node, kind, text in _strings(tree, source):
        if (msgstr := lookup(text, node.lineno)) is None:
            continue
        start, end = _span(lines, node)
        original = source[start:end]
        quote = _pieces(original)[0][1]
        if kind == "f-string" and fields(msgstr) != fields(text):
            raise ProgramTranslationError(
                f"line {node.lineno}: the translation of the f-string {text[:60]!r} must keep its"
                f" replacement fields, {fields(text)}; it has {fields(msgstr)}")
        if kind == "f-string" and (wrong := label_width_problems(text, msgstr)):
            raise ProgramTranslationError(
                f"line {node.lineno}: the translation of the f-string {text[:60]!r} misaligns its"
                " columns: " + "; ".join(wrong))
        if kind == "string" and format_fields(msgstr) != format_fields(text):
            raise ProgramTranslationError(
                f"line {node.lineno}: the translation of {text[:60]!r} must keep its str.format"
                f" fields, {format_fields(text)}; it has {format_fields(msgstr)}")
        column = len(lines[node.lineno - 1].encode("utf-8")[: node.col_offset].decode("utf-8"))
        joiner = ""
        if "\n" in original:  # the original ran over lines: so does its translation
            joiner = (" \\\n" if "\\\n" in original else "\n") + " " * column
        edits.append((start, end, _literals(msgstr, kind, quote, column, joiner)))

    if missing and strict:
        raise ProgramTranslationError("messages without a translation:\n  " + "\n  ".join(missing))
    if strict and (misaligned := label_column_problems(source, translations)):
        raise ProgramTranslationError("columns out of line:\n  " + "\n  ".join(misaligned))
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    check_equivalent(source, out)
    return out


# -- The invariant ------------------------------------------------------------------------------

class _Mask(ast.NodeTransformer):
    def visit_Constant(self, node):
        return ast.Constant(value="") if isinstance(node.value, str) else node

    def visit_FormattedValue(self, node):  # a format specification is code: kept as written,
        if is_label_field(node):  # except a label's, whose width is its text's
            return ast.FormattedValue(value=ast.Constant(value=""), conversion=-1, format_spec=None)
        return ast.FormattedValue(value=self.visit(node.value), conversion=node.conversion,
                                  format_spec=node.format_spec)

    def visit_JoinedStr(self, node):  # its fields, in any order: a translation may reorder them
        kept = [self.visit(v) for v in node.values if isinstance(v, ast.FormattedValue)]
        return ast.JoinedStr(values=sorted(kept, key=ast.dump))


def masked_tree(source):
    """The program's syntax tree with string constants masked and f-strings reduced to
    their replacement fields, as text."""
    return ast.dump(_Mask().visit(ast.parse(source)), annotate_fields=False, include_attributes=False)


def check_equivalent(original, rendering):
    """Raise unless the two programs differ only in their strings (and comments)."""
    try:
        ast.parse(rendering)
    except SyntaxError as error:
        raise ProgramTranslationError(f"the translated program does not parse: line {error.lineno}:"
                                      f" {error.msg}\n  {error.text}") from None
    a, b = masked_tree(original), masked_tree(rendering)
    if a != b:
        at = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if a[: len(b)] != b[: len(a)] else min(len(a), len(b))
        raise ProgramTranslationError(
            "the translated program computes something else: its syntax tree, strings masked,"
            f" differs from the original's at\n  original:   ...{a[max(0, at - 80):at + 80]}\n"
            f"  translated: ...{b[max(0, at - 80):at + 80]}")


# -- The page's prose in the program: for the downloads ---------------------------------------

TITLE_UNDERLINE = re.compile(r"([=\-~^\"'`#*+<>_])\1+")
LIST_ITEM = re.compile(r"([-*+]|\d+\.|#\.)\s+")


def _paragraphs(lines):
    """Runs of non-blank lines, and the blank lines between them, in order."""
    runs, current = [], []
    for line in lines:
        if line.strip():
            current.append(line)
            continue
        if current:
            runs.append(current)
            current = []
        runs.append([line])
    if current:
        runs.append(current)
    return runs


def _items(paragraph):
    """A list's items: each starts at a line with a marker at the paragraph's indent."""
    items = []
    for line in paragraph:
        if LIST_ITEM.match(line) or not items:
            items.append([line])
        else:
            items[-1].append(line)
    return items


def _filled(text, width, indent=""):
    """``text`` on lines of ``width`` columns (one line when ``width`` is None)."""
    if width is None:
        return [indent + text]
    return [indent + line for line in _wrap(text, width - display_width(indent))]


def translate_rst(lines, translations, width=None):
    """reStructuredText lines with each paragraph, title and list item that has a translation
    replaced by it; anything else (directives, literal blocks, tables) as it was."""
    out = []
    for paragraph in _paragraphs(lines):
        if len(paragraph) >= 2 and paragraph[0].strip() and TITLE_UNDERLINE.fullmatch(paragraph[1].strip()):
            title = translations.get(paragraph[0].strip())
            out += [title, paragraph[1].strip()[0] * display_width(title)] if title else paragraph[:2]
            paragraph = paragraph[2:]  # a title may have its first paragraph right under it
            if not paragraph:
                continue
        first = paragraph[0]
        text = " ".join(line.strip() for line in paragraph)
        if not first.strip():
            out.extend(paragraph)
        elif LIST_ITEM.match(first):
            for item in _items(paragraph):
                marker = LIST_ITEM.match(item[0]).group()
                text = " ".join([item[0][len(marker):].strip(), *(line.strip() for line in item[1:])])
                if msgstr := translations.get(text):
                    lines_out = _filled(msgstr, width, " " * len(marker))
                    out += [marker + lines_out[0][len(marker):], *lines_out[1:]]
                else:
                    out.extend(item)
        elif first.startswith((" ", "..")) or any(line.startswith(" ") for line in paragraph):
            out.extend(paragraph)
        elif msgstr := translations.get(text):
            out += _filled(msgstr, width)
        elif text.endswith("::") and (msgstr := translations.get(text[:-1].rstrip())):
            out += _filled(msgstr + " ::", width)  # its literal block follows; "text ::" shows "text"
        else:
            out.extend(paragraph)
    return out


def translate_text_blocks(source, translations, width=WIDTH):
    """The program with the page's prose in it translated: its module docstring (the page's
    title and introduction) and the gallery's text blocks, from the page's own messages
    (``translations``: msgid -> msgstr, the page catalog's). The code is untouched, so the
    result computes what ``source`` does (checked). ``width`` None: one line a paragraph."""
    tree = ast.parse(source)
    lines = _segment_lines(source)
    edits = []
    module_doc, _ = _docstrings(tree)
    if module_doc is not None:
        start, end = _span(lines, module_doc)
        original = source[start:end]
        prefix = re.match(r"[rRuU]?", original).group()
        quote = original[len(prefix):len(prefix) + 3]
        if quote in ('"""', "'''"):
            body = original[len(prefix) + 3:-3]
            translated = "\n".join(translate_rst(body.split("\n"), translations, width))
            if translated != body and not ("\\" in translated and "\\" in body and not prefix):
                if "\\" in translated and "r" not in prefix.lower():
                    prefix = "r" + prefix
                edits.append((start, end, prefix + quote + translated + quote))
    text_lines = sorted(_text_block_lines(lines))
    blocks, current = [], []
    for number in text_lines:
        if TEXT_BLOCK_START.match(lines[number - 1]):
            current = []
            blocks.append(current)
        else:
            current.append(number)
    for block in blocks:
        if not block:
            continue
        rst = [lines[n - 1].rstrip("\r\n")[2:] if lines[n - 1].startswith("# ") else
               lines[n - 1].rstrip("\r\n")[1:] for n in block]
        translated = translate_rst(rst, translations, None if width is None else width - 2)
        if translated != rst:
            start = _char_offset(lines, block[0], 0)
            end = _char_offset(lines, block[-1], 0) + len(lines[block[-1] - 1])
            edits.append((start, end, "".join(("# " + t).rstrip() + "\n" for t in translated)))
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    check_equivalent(source, out)
    return out
