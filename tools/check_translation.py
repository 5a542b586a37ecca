"""Check the Chinese catalogs, then build the Chinese edition in a scratch copy.

    .venv/bin/python tools/check_translation.py          # the checks below, then the build
    .venv/bin/python tools/check_translation.py --lint   # the checks only, in seconds

The checks read every translated message of locale/zh_CN (untranslated and
fuzzy ones are the completeness test's business, not theirs):

- terminology: the renderings of docs/glossary.toml, none of its rejected
  variants, and no English words left inside ``\\text{}`` in math;
- typography: autocorrect-py's CJK rules (spaces between Chinese and Latin or
  digits, full-width punctuation) plus a few of our own, run on the text with
  markup, code, links and math masked out;
- markup parity: each translation keeps its original's roles, link targets,
  inline code, math and substitutions.

The build copy writes the Chinese programs, takes their outputs from the last
make html (_build/tree-zh_CN/source/auto_examples) as they are and executes
nothing, so it is quick and safe to run while other work goes on.
"""

import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import autocorrect_py
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.catalog_stats import LOCALE
from tools.catalog_stats import main as print_catalog_stats
from tools.site_build import copy_checkout

GLOSSARY_DATA = REPO / "docs" / "glossary.toml"
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"


@dataclass(frozen=True)
class Message:
    catalog: str  # relative to locale/zh_CN/LC_MESSAGES, e.g. "lectures/lecture05_gpus.po"
    id: str
    string: str
    program: bool = False  # a message of an example's program (context "program"): not markup


@dataclass(frozen=True)
class Finding:
    catalog: str
    msgid: str
    check: str
    detail: str
    term: str = ""  # the glossary term a terminology finding is about

    def __str__(self):
        head = self.msgid if len(self.msgid) <= 70 else self.msgid[:67] + "..."
        return f"{self.catalog}: {head!r}: {self.check}: {self.detail}"


def translated_messages(locale=LOCALE):
    """Every message with a translation that is not fuzzy, catalog by catalog."""
    found = []
    for po_file in sorted(Path(locale).rglob("*.po")):
        with open(po_file, "rb") as f:
            catalog = read_po(f)
        name = po_file.relative_to(locale).as_posix()
        found += [Message(name, m.id, m.string, m.context == "program")
                  for m in catalog if m.id and m.string and not m.fuzzy]
    return found


def write_catalog(locale, name, pairs, fuzzy=()):
    """Write a zh_CN catalog of (msgid, msgstr) pairs under ``locale``: a sample for the checks."""
    catalog = Catalog(locale="zh_CN")
    for msgid, msgstr in pairs:
        catalog.add(msgid, msgstr, flags=("fuzzy",) if msgid in fuzzy else ())
    path = Path(locale, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        write_po(f, catalog)
    return path


# -- Markup ---------------------------------------------------------------------
# The catalogs hold MyST (lecture pages) and reStructuredText (the examples' text
# blocks). A span is one piece of markup that the checks must treat as a whole.

SPAN = re.compile(
    r"(?P<myst_role>\{(?P<mr>[\w:.+-]+)\}`(?P<mrc>[^`]*)`)"
    r"|(?P<rst_role>:(?P<rr>[\w:.+-]+):`(?P<rrc>[^`]*)`)"
    r"|(?P<literal>``.+?``)"
    r"|(?P<rst_link>`(?P<rlc>[^`]*<(?P<rlu>[^>`]+)>)`__?)"
    r"|(?P<code>`[^`]+`)"
    r"|(?P<myst_link>!?\[(?P<mlc>[^\]]*)\]\((?P<mlu>[^)\s]+)\))"
    r"|(?P<url>https?://[^\s)（）\]，。；、]+)"
    r"|(?P<math>\$\$.+?\$\$|\$[^$\s](?:[^$]*[^$\s])?\$)"
    r"|(?P<subst>\{\{[^}]*\}\}|\|[\w .-]+\|(?!_))",
    re.DOTALL,
)
# Roles that show their label, or the title of what they point to, as prose.
PROSE_ROLES = {"ref", "doc", "download", "numref", "term", "sup", "sub", "abbr"}
TEXT_IN_MATH = re.compile(r"\\(?:text|mathrm|operatorname)\{([^{}]*)\}")
LATEX_WORD = re.compile(r"\\[A-Za-z]+|\{|\}|\b[A-Za-z]\b")


def is_display_math(msgid):
    """A message that is a whole formula: LaTeX, no inline markup, no English sentence."""
    if "$" in msgid or "`" in msgid or not re.search(r"[\\^_=]", msgid):
        return False
    words = LATEX_WORD.sub(" ", TEXT_IN_MATH.sub(" ", msgid))
    return not re.search(r"[A-Za-z]{3,} [A-Za-z]{3,}", words)


def is_formula(msg):
    """A message that is display math; never a program's, whose f-string fields hold _ and =."""
    return not msg.program and is_display_math(msg.id)


def normalise_math(tex):
    """Math as the parity check compares it: the words inside \\text{} may be translated."""
    return re.sub(r"\s+", " ", TEXT_IN_MATH.sub(lambda m: m.group(0).split("{")[0] + "{}", tex)).strip()


def markup_tokens(text):
    """What a translation must keep: role targets, link targets, code, math, substitutions."""
    tokens = Counter()
    for m in SPAN.finditer(text):
        kind = m.lastgroup
        if kind in ("myst_role", "rst_role"):
            role = m.group("mr") or m.group("rr")
            content = m.group("mrc") if kind == "myst_role" else m.group("rrc")
            if role == "math":
                content = normalise_math(content)
            elif role in PROSE_ROLES:
                target = re.search(r"<([^<>]+)>\s*$", content)
                content = target.group(1) if target else content
                if role in ("sup", "sub", "abbr"):
                    continue  # their content is text, and is translated
            tokens[f"{{{role}}}`{content}`"] += 1
        elif kind in ("rst_link", "myst_link"):
            tokens["link " + (m.group("rlu") or m.group("mlu"))] += 1
        elif kind == "math":
            tokens["$" + normalise_math(m.group(kind).strip("$")) + "$"] += 1
        else:
            tokens[m.group(kind)] += 1
    return tokens


def markup_findings(messages):
    """Translations that dropped, added or changed a piece of markup of their original."""
    found = []
    for msg in messages:
        if msg.program:  # not markup: a program's strings are text (|error| is no substitution),
            continue  # and program_i18n checks what a translation of them must keep
        if is_formula(msg):
            if normalise_math(msg.id) != normalise_math(msg.string):
                found.append(Finding(msg.catalog, msg.id, "markup", "the formula differs from the original"))
            continue
        want, have = markup_tokens(msg.id), markup_tokens(msg.string)
        if want != have:
            lost = ", ".join(sorted((want - have).elements())) or "nothing"
            extra = ", ".join(sorted((have - want).elements())) or "nothing"
            found.append(Finding(msg.catalog, msg.id, "markup", f"lost {lost}; added {extra}"))
    return found


def rst_findings(messages):
    """Examples' translations whose inline markup docutils cannot close.

    In reStructuredText a literal or role must end before a space or one of
    certain punctuation marks: ``code``（ or ``code``的 leave it open (write
    ``code``\\ （), and the page shows the raw backquotes. Only the examples'
    catalogs are reStructuredText; the lecture pages' are MyST.
    """
    import io

    from docutils.core import publish_doctree

    found = []
    for msg in messages:
        if not msg.catalog.startswith("auto_examples/") or msg.program:  # a program's text is not rst
            continue
        report = io.StringIO()
        # Sphinx's roles are unknown to plain docutils: any known role parses the same.
        text = re.sub(r":[\w:.+-]+:`", ":code:`", msg.string)
        publish_doctree(text, settings_overrides={"warning_stream": report, "report_level": 2,
                                                  "halt_level": 5, "input_encoding": "unicode"})
        problems = [line for line in report.getvalue().splitlines() if "start-string without end-string" in line]
        if problems:
            found.append(Finding(msg.catalog, msg.id, "rst", problems[0].split(") ", 1)[-1]))
    return found


def prose(text, placeholder="0"):
    """The text with every span of markup replaced: what the wording checks read."""
    return SPAN.sub(placeholder, text).replace("\\ ", "")


# -- Terminology ------------------------------------------------------------------------


def load_glossary(path=GLOSSARY_DATA):
    with open(path, "rb") as f:
        return tomllib.load(f)


def _rejected(term):
    """(label, compiled pattern) for each variant that must not appear in a translation."""
    literal = [(v, re.compile(re.escape(v))) for v in term.get("reject", [])]
    return literal + [(p, re.compile(p)) for p in term.get("reject_pattern", [])]


def english_in_math(text, units):
    """The \\text{} words of the text's math that were left in English."""
    left = []
    for m in SPAN.finditer(text):
        kind = m.lastgroup
        tex = m.group(0) if kind == "math" or (kind in ("myst_role", "rst_role") and
                                             (m.group("mr") or m.group("rr")) == "math") else None
        for t in re.finditer(r"(?<![_^])\\text\{([^{}]*)\}", tex or ""):
            if any(re.search(r"[A-Za-z]{2}", w) and w not in units for w in t.group(1).split()):
                left.append(t.group(0))
    return left


def terminology_findings(messages, glossary=None):
    """Rejected variants, missing renderings of glossary terms, and English words in math."""
    glossary = glossary or load_glossary()
    rules = {
        "terms": glossary.get("term", []),
        "rejected": [(rule, _rejected(rule)) for rule in glossary.get("term", []) + glossary.get("style", [])],
        "excused": {(e["term"], e["catalog"], e["msgid"]) for e in glossary.get("exception", [])},
        "units": set(glossary.get("math", {}).get("units", [])),
    }
    return [Finding(msg.catalog, msg.id, "terminology", detail, term)
            for msg in messages for detail, term in _terminology_of(msg, **rules)]


def _terminology_of(msg, terms, rejected, excused, units):
    """(detail, term) for each terminology problem of one message."""
    display = is_formula(msg)
    for tex in english_in_math(f"$${msg.string}$$" if display else msg.string, units):
        yield f"English left in math: {tex}", ""
    if display:
        return
    source, translation = prose(msg.id), prose(msg.string)
    if msg.program and msg.string == msg.id:  # kept as it is: a string the code computes with
        return
    if msg.program:  # an f-string's fields are code: {recompute} is not the word recomputation,
        # and a column's label, {'eager ms':>9}, is an abbreviation the width allows
        source, translation = (re.sub(r"\{[^{}]*\}", "0", t) for t in (source, translation))
    for rule, patterns in rejected:
        variant = next((label for label, pattern in patterns if pattern.search(translation)), None)
        if variant:
            yield f"rejected {variant!r} for {rule['en']!r}; write {rule.get('zh') or rule['instead']!r}", rule["en"]
    for term in terms:
        if "match" not in term or msg.catalog not in term.get("catalogs", [msg.catalog]):
            continue
        if not re.search(term["match"], source, re.IGNORECASE):
            continue
        accept = term.get("accept", [term["zh"]])
        if any(form in translation for form in accept):
            continue
        if any(t == term["en"] and c == msg.catalog and msg.id.startswith(start) for t, c, start in excused):
            continue
        yield f"the original says {term['en']!r}; the translation lacks {' / '.join(accept)!r}", term["en"]


def unused_exceptions(messages, glossary=None):
    """Exceptions that no longer silence anything: the list stays short and true."""
    glossary = glossary or load_glossary()
    unexcused = terminology_findings(messages, dict(glossary, exception=[]))
    return [e for e in glossary.get("exception", [])
            if not any(f.term == e["term"] and f.catalog == e["catalog"] and f.msgid.startswith(e["msgid"])
                       for f in unexcused)]


# -- Typography ------------------------------------------------------------------------
# autocorrect-py lints the text with each span of markup replaced by a private-use
# character, padded with an "x" on each side that shows Latin text (code, math, a
# URL), so that the linter asks for a space between it and Chinese; a span glued
# on with a reStructuredText escape ("\ ") or showing Chinese (a link's label, a
# page title) is not padded.

OWN_RULES = [
    (re.compile(rf"[{CJK}]\s*[,;?!]|[,;?!](?=\s*[{CJK}])"), "half-width punctuation in a Chinese sentence"),
    (re.compile(rf"[{CJK}]:(?!\S*://)|:(?=\s*[{CJK}])"), "half-width colon in a Chinese sentence"),
    (re.compile(rf"\([^()]*[{CJK}][^()]*\)"), "half-width parentheses around Chinese"),
    (re.compile(rf"\"[^\"]*[{CJK}][^\"]*\""), "straight quotes around Chinese; use “”"),
    (re.compile("x[\ue000-\uf8ff]x?, x?[\ue000-\uf8ff]x"), "half-width comma between list items; use 、"),
    (re.compile(r"\d\s+[%％]"), "a space before a percent sign; write 8%"),
    # 32x32, 2 x 4, 3.0x: an ASCII letter for multiplication in prose (code and math are masked,
    # and the padding "x" of a placeholder never stands between two numbers)
    (re.compile(rf"(?<![\w.])(?!0x)\d+(?:\.\d+)?\s?[xX]\s?\d+(?![\w.])"
                rf"|(?<![\w.])\d+(?:\.\d+)?[xX](?=[\s，。；：、）{CJK}]|$)"), "ASCII x for multiplication; write ×"),
    (re.compile("（[^（）]*（[^（）]*）[^（）]*）"), "nested full-width parentheses; rephrase"),
    # The joining dash of Chinese text is the one-em 一字线 (时间—字节数, α—β 模型); the sentence
    # dash is ——. An en dash or a hyphen between Chinese words (or Greek symbols) is neither.
    (re.compile(rf"(?<=[{CJK}α-ω])\s?[–‐－-]\s?(?=[{CJK}α-ω])"), "en dash or hyphen joining Chinese words; write —"),
]

# reStructuredText (the examples' catalogs) shows the space that opens or closes inline
# markup: emphasis inside a Chinese sentence is joined with escaped spaces, 的\ *延迟*\ ，.
RST_RULES = [
    (re.compile(rf"[{CJK}，。；：、（）“”] \*{{1,2}}(?=[{CJK}])|(?<=[{CJK}])\*{{1,2}} (?=[{CJK}，。；：、（）“”])"),
     "a visible space around emphasis in a Chinese sentence; join it with \\ "),
]

# A source's title quoted in the original ("Coalesced Access to Global Memory") stays in its
# language in the translation (docs/glossary.md's conventions).
QUOTED_TITLE = re.compile(r"[\"“]([A-Z][\w-]*(?:[ :]+[\w()-]+)+)[\"”]")


def _shows_latin(match, edge):
    kind = match.lastgroup
    if kind in ("myst_role", "rst_role"):
        role = match.group("mr") or match.group("rr")
        content = match.group("mrc") if kind == "myst_role" else match.group("rrc")
        if role not in PROSE_ROLES:
            return True
        label = re.sub(r"\s*<[^<>]*>\s*$", "", content) if "<" in content else ""
        text = label.strip()
    elif kind in ("rst_link", "myst_link"):
        text = re.sub(r"\s*<[^<>]*>\s*$", "", match.group("rlc") or match.group("mlc") or "").strip()
    else:
        return True
    return bool(text) and bool(re.match(r"[A-Za-z0-9]", text[0] if edge == "left" else text[-1]))


def mask_for_lint(text):
    """(masked text, placeholder -> original) for the typography linter."""
    originals = {}
    out, last = [], 0
    for i, m in enumerate(SPAN.finditer(text)):
        start, end = m.span()
        left = "" if text[max(0, start - 2):start] == "\\ " or not _shows_latin(m, "left") else "x"
        right = "" if text[end:end + 2] == "\\ " or not _shows_latin(m, "right") else "x"
        placeholder = left + chr(0xE000 + i) + right
        originals[placeholder] = m.group(0)
        out.append(text[last:start] + placeholder)
        last = end
    out.append(text[last:])
    masked = "".join(out).replace("\\ ", "\u200b")  # an escaped space renders as nothing
    return masked, originals


def unmask(text, originals):
    for placeholder, original in originals.items():
        text = text.replace(placeholder, original)
    return text.replace("\u200b", "\\ ")


def typography_findings(messages):
    """CJK typography of every translation, by autocorrect-py and our own rules."""
    found = []
    for msg in messages:
        if is_formula(msg) or not re.search(f"[{CJK}]|`", msg.string):
            continue
        masked, originals = mask_for_lint(msg.string)
        # Without Chinese left, autocorrect-py takes the text for English and asks for
        # half-width punctuation; such a message (a list of code) is our rules' business.
        corrected = autocorrect_py.format(masked) if re.search(f"[{CJK}]", masked) else masked
        if corrected != masked:
            found.append(Finding(msg.catalog, msg.id, "typography",
                                 f"autocorrect-py: {_first_difference(masked, corrected, originals)}"))
        rules = OWN_RULES + (RST_RULES if msg.catalog.startswith("auto_examples/") and not msg.program else [])
        for pattern, rule in rules:
            for m in pattern.finditer(masked):
                context = masked[max(0, m.start() - 12):m.end() + 12]
                found.append(Finding(msg.catalog, msg.id, "typography", f"{rule}: …{unmask(context, originals)}…"))
        for title in QUOTED_TITLE.findall(prose(msg.id)):
            if title not in msg.string:
                found.append(Finding(msg.catalog, msg.id, "typography",
                                     f"quoted source title translated; keep it as it is: “{title}”"))
    return found


def _first_difference(old, new, originals):
    i = next((k for k, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    j = 0
    while j < min(len(old), len(new)) - i and old[-1 - j] == new[-1 - j]:
        j += 1
    was, now = old[max(0, i - 12):len(old) - j + 12], new[max(0, i - 12):len(new) - j + 12]
    return f"…{unmask(was, originals)}… should be …{unmask(now, originals)}…"


def lint(locale=LOCALE, glossary=None):
    """All findings of the three checks over the catalogs in ``locale``."""
    messages = translated_messages(locale)
    return {
        "terminology": terminology_findings(messages, glossary),
        "typography": typography_findings(messages),
        "markup": markup_findings(messages),
    }


def print_lint():
    results = lint()
    for check, findings in results.items():
        print(f"{check}: {len(findings)} finding(s)")
        for f in findings:
            print(f"  {f}")
    return 1 if any(results.values()) else 0


def build():
    """Build the Chinese edition in a scratch copy; 1 if Sphinx warned."""
    with tempfile.TemporaryDirectory() as tmp:
        checkout = copy_checkout(Path(tmp, "site"))
        tree = Path("_build", "tree-zh_CN")
        written = subprocess.run([sys.executable, "tools/program_messages.py", "write", str(tree)],
                                 cwd=checkout, capture_output=True, text=True, check=False)
        if written.returncode:
            print(written.stdout + written.stderr)
            return 1
        generated = REPO / tree / "source" / "auto_examples"
        if generated.is_dir():
            shutil.copytree(generated, checkout / tree / "source" / "auto_examples", dirs_exist_ok=True)
        done = subprocess.run(
            [str(Path(sys.prefix, "bin", "sphinx-build")), "-c", ".", "-W", "--keep-going",
             "-b", "html", "-D", "language=zh_CN", "-D", "plot_gallery=0", "-q",
             "-d", "_build/doctrees", str(tree / "source"), "_build/html"],
            cwd=checkout, capture_output=True, text=True, check=False,
        )
        warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
        print("\n".join(warnings) or "zh_CN edition: no warnings")
    return 1 if warnings else 0


def main(argv):
    checks = print_lint()
    if "--lint" in argv:
        return checks
    return max(checks, print_catalog_stats(), build())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
