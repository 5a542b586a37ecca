"""Write the intersphinx inventories that link the examples' code to the PyTorch and Triton docs.

On an example page, names such as ``torch.compile``, ``F.gelu``, ``triton.jit``
or ``tl.load`` link to their entries in the official API reference. Sphinx
finds those entries in inventories (``objects.inv``), which intersphinx
normally downloads from docs.pytorch.org and triton-lang.org. The site builds
offline, so it cannot download them: this script writes the part of them the
course needs, ``inventories/torch.inv`` and ``inventories/triton.inv``, which
are committed and named in ``intersphinx_mapping`` in conf.py.

How it works. It reads every example with ``ast`` and follows its imports
(``F.gelu`` is ``torch.nn.functional.gelu``, ``tl.load`` is
``triton.language.load``), and it reads the ``:func:``-style roles of the
text blocks. It keeps the names that resolve in the installed torch and
triton, finds the name each object is documented under (``torch.cuda.
memory_allocated`` is documented as ``torch.cuda.memory.memory_allocated``),
classifies it (module, class, function, method, property) by introspection,
and writes it with the URL where the docs put it.

Which page documents which name is written down in the tables below. Each
entry was checked against the docs' sources (pytorch/pytorch
``docs/source/*.md``, triton-lang/triton ``docs/python-api/*.rst``) and
against rendered pages. A name the tables do not list gets no link: no URL is
ever guessed. The script prints the names it left out, so that a new example
shows what still needs checking.

Regenerate after changing an example, with torch and triton installed::

    python tools/make_inventories.py
"""

import ast
import importlib
import inspect
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(REPO.glob("examples/lecture*/*.py"))
OUTPUT = REPO / "inventories"

TORCH_DOCS = "https://docs.pytorch.org/docs/stable/"
TRITON_DOCS = "https://triton-lang.org/main/"

# Objects with a page of their own: autosummary ``:toctree: generated``.
TORCH_GENERATED = {
    # docs/source/torch.md
    "torch.add", "torch.arange", "torch.compile", "torch.cos", "torch.empty",
    "torch.empty_like", "torch.exp", "torch.full", "torch.get_num_threads",
    "torch.logspace", "torch.manual_seed", "torch.matmul", "torch.maximum",
    "torch.ones", "torch.ones_like", "torch.rand", "torch.randn", "torch.randn_like",
    "torch.rsqrt", "torch.sin", "torch.softmax", "torch.tanh", "torch.where",
    "torch.zeros", "torch.zeros_like",
    # docs/source/cuda.md: the memory functions live in torch.cuda.memory
    "torch.cuda.get_device_capability", "torch.cuda.get_device_name",
    "torch.cuda.get_device_properties", "torch.cuda.is_available",
    "torch.cuda.is_bf16_supported", "torch.cuda.synchronize",
    "torch.cuda.memory.max_memory_allocated", "torch.cuda.memory.memory_allocated",
    "torch.cuda.memory.reset_peak_memory_stats",
    # docs/source/nn.md
    "torch.nn.Linear", "torch.nn.Module", "torch.nn.parameter.Parameter",
    # docs/source/nn.functional.md
    "torch.nn.functional.gelu", "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.softmax",
    # docs/source/torch.compiler_api.md, logging.md, autograd.md
    "torch.compiler.reset", "torch._logging.set_logs",
    "torch.autograd.profiler.record_function",
}

# Objects documented on a shared page, anchored by their name; modules
# (``automodule`` or ``py:module``) are anchored as ``module-<name>``.
# Not torch.finfo: type_info.md declares ``.. class:: torch.finfo`` under
# ``currentmodule:: torch``, so its anchor is not plainly ``torch.finfo``.
TORCH_ON_PAGE = {
    "torch.html": {"torch", "torch.SymInt"},
    "tensors.html": {"torch.Tensor"},
    "tensor_attributes.html": {"torch.dtype", "torch.device"},
    "cuda.html": {"torch.cuda", "torch.cuda.memory"},
    "autograd.html": {"torch.autograd", "torch.autograd.Function", "torch.autograd.graph",
                      "torch.autograd.graph.saved_tensors_hooks"},
    "profiler.html": {"torch.profiler", "torch.profiler.profile", "torch.profiler.ProfilerActivity"},
    "benchmark_utils.html": {"torch.utils.benchmark", "torch.utils.benchmark.Timer",
                             "torch.utils.benchmark.Measurement"},
    "testing.html": {"torch.testing", "torch.testing.assert_close"},
    "cpp_extension.html": {"torch.utils.cpp_extension.load_inline"},
}

# docs/python-api/triton.rst, triton.language.rst and triton.testing.rst:
# autosummary ``:toctree: generated`` under python-api/.
TRITON_GENERATED = {
    "triton.jit", "triton.autotune", "triton.heuristics", "triton.Config",
    "triton.language.abs", "triton.language.arange", "triton.language.cdiv",
    "triton.language.dot", "triton.language.exp", "triton.language.exp2",
    "triton.language.full", "triton.language.load", "triton.language.max",
    "triton.language.maximum", "triton.language.minimum", "triton.language.program_id",
    "triton.language.sigmoid", "triton.language.store", "triton.language.sum",
    "triton.language.tensor", "triton.language.trans", "triton.language.where",
    "triton.language.zeros",
    "triton.testing.do_bench", "triton.testing.do_bench_cudagraph",
}

# Classes documented with ``:members:``: their members that have a docstring
# are documented on the class's page, as ``<class>.<member>``.
WITH_MEMBERS = {"torch.profiler.profile", "torch.utils.benchmark.Timer",
                "torch.utils.benchmark.Measurement"}

# The types of the values the examples make, which sphinx-gallery links
# wherever a variable holds one, though the code seldom writes their names.
VALUE_TYPES = {"torch.Tensor", "torch.dtype", "torch.device"}

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj):`~?([\w.]+)`")


@dataclass(frozen=True)
class Entry:
    name: str
    role: str
    uri: str


@dataclass(frozen=True)
class Project:
    name: str
    version: str
    base: str  # the docs' root, as intersphinx_mapping in conf.py names it
    folder: str  # where autosummary writes the pages of its own
    own_pages: set
    shared_pages: dict

    def page_of(self, name):
        """The page, relative to the docs' root, that documents ``name``, or None."""
        if name in self.own_pages:
            return f"{self.folder}/{name}.html"
        return next((page for page, names in self.shared_pages.items() if name in names), None)


def import_aliases(tree):
    """Map each name an example binds by an import to the dotted name it stands for."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                aliases[bound] = alias.name if alias.asname else bound
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def dotted_parts(node):
    """``['F', 'gelu']`` for the expression ``F.gelu``; None for anything but a name chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def names_in_example(source):
    """The dotted names an example uses (through its imports), and every attribute name it reads."""
    tree = ast.parse(source)
    aliases = import_aliases(tree)
    names = set(aliases.values())
    attributes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            attributes.add(node.attr)
        parts = dotted_parts(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if parts and parts[0] in aliases:
            names.add(".".join([aliases[parts[0]], *parts[1:]]))
    names.update(ROLE.findall(source))
    return names, attributes


def resolve(name):
    """The object ``name`` refers to in the installed packages, or None."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for part in parts[split:]:
                obj = getattr(obj, part)
        except AttributeError:
            return None
        return obj
    return None


def defined_name(obj):
    """Where a function or class is defined, e.g. ``torch.cuda.memory.memory_allocated``."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}.{qualname}"
    return None


def role_of(obj, owner=None, member=None):
    """The py domain role the docs give an object: module, class, function, method, property."""
    if owner is not None:
        static = inspect.getattr_static(owner, member)
        if isinstance(static, property):
            return "property"
        return "method" if callable(obj) else "attribute"
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else "data"


def documented_entry(project, written):
    """The entry for a name an example writes, under the name its docs use; None if undocumented."""
    obj = resolve(written)
    if obj is None:
        return None
    for name in filter(None, (written, defined_name(obj))):
        page = project.page_of(name)
        if page is not None and resolve(name) is obj:
            anchor = f"module-{name}" if inspect.ismodule(obj) else name
            return Entry(name, role_of(obj), f"{page}#{anchor}")
    return None


def member_entries(class_entry, attributes):
    """Members of a class documented with ``:members:`` that the examples read."""
    owner = resolve(class_entry.name)
    page = class_entry.uri.split("#")[0]
    entries = []
    for member in sorted(attributes):
        if member.startswith("_") or not hasattr(owner, member):
            continue
        value = getattr(owner, member)
        static = inspect.getattr_static(owner, member)
        doc = static.__doc__ if isinstance(static, property) else inspect.getdoc(value)
        if doc:
            name = f"{class_entry.name}.{member}"
            entries.append(Entry(name, role_of(value, owner, member), f"{page}#{name}"))
    return entries


def inventory_entries(project, names, attributes):
    """Entries for every documented name, plus the documented members the examples read.

    A name written differently from its documented name (``torch.nn.Parameter``
    for ``torch.nn.parameter.Parameter``) gets an entry of its own with the same
    URL, so that a linker that looks up names as written finds it too.
    """
    entries, skipped = {}, []
    for written in sorted(names):
        entry = documented_entry(project, written)
        if entry is None:
            skipped.append(written)
            continue
        entries[entry.name] = entry
        if written != entry.name:
            entries[written] = Entry(written, entry.role, entry.uri)
        if entry.name in WITH_MEMBERS:
            entries.update((e.name, e) for e in member_entries(entry, attributes))
    return sorted(entries.values(), key=lambda e: e.name), skipped


def inventory_bytes(project, entries):
    """An ``objects.inv`` in Sphinx's format version 2: four header lines, then zlib text."""
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project.name}\n"
        f"# Version: {project.version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    # priority: 0 for modules, 1 for other objects, as Sphinx's py domain writes them
    lines = "".join(f"{e.name} py:{e.role} {0 if e.role == 'module' else 1} {e.uri} -\n" for e in entries)
    return header.encode() + zlib.compress(lines.encode(), 9)


def projects():
    """The two documentation sites, keyed by the package they document."""
    import torch
    import triton

    torch_version = torch.__version__.split("+")[0]
    return {
        "torch": Project("PyTorch", torch_version, TORCH_DOCS, "generated", TORCH_GENERATED, TORCH_ON_PAGE),
        "triton": Project("Triton", triton.__version__, TRITON_DOCS, "python-api/generated", TRITON_GENERATED, {}),
    }


def inventories():
    """For each package: its project, its inventory entries and the names left out."""
    names, attributes = set(VALUE_TYPES), set()
    for example in EXAMPLES:
        used, read = names_in_example(example.read_text(encoding="utf-8"))
        names |= used
        attributes |= read
    result = {}
    for package, project in projects().items():
        own = {n for n in names if n.split(".")[0] == package}
        result[package] = (project, *inventory_entries(project, own, attributes))
    return result


def main():
    OUTPUT.mkdir(exist_ok=True)
    for package, (project, entries, skipped) in inventories().items():
        target = OUTPUT / f"{package}.inv"
        target.write_bytes(inventory_bytes(project, entries))
        print(f"{target.relative_to(REPO)}: {len(entries)} names in {project.base}")
        print(f"  left out (undocumented, private or unresolved): {', '.join(skipped) or 'none'}")


if __name__ == "__main__":
    main()
