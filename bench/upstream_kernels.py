"""SGLang's split-KV verify kernels for ``python -m bench kernel``, from the installed SGLang or
loaded by file path from another release's source, with a record of where each one came from.

Kernels (name -> module of ``sglang.kernels.ops.attention``, entry point; both take
``extend_attention_fwd``'s positional arguments and return True when they ran, False when their
own ``can_handle`` declines the problem):
  splitkv    verify_splitkv.py  ``verify_splitkv_fwd``   grid (bs, q heads, splits)
  shared_kv  verify_mla.py      ``verify_shared_kv_fwd`` grid (bs, q-head blocks, splits); not in
                                                         0.5.16 (added by sglang#33981)

``upstream_src`` (``--upstream-src``): a folder that holds ``sglang/`` (or is it), or a ``.tar``,
``.tar.gz`` or ``.tar.xz`` of such a folder (``scripts/pack_bundle.sh`` writes one of just these
files from a 0.5.23 install: ``sglang/_version.py`` and the two kernel modules). With it, every
requested kernel is loaded from that source: the module file is executed under a private module
name (``bench_upstream_src.<module>``), never replacing the installed ``sglang`` modules. Its
``sglang`` imports resolve as follows, each recorded: a module of the same load
(``verify_mla`` imports ``_AMD_LAUNCH_KWARGS`` from ``verify_splitkv``) is the source copy; any
other (``sglang.srt.utils.is_hip``) is the installed release's, and a name missing there is a
load error. A kernel that cannot be loaded from the source is an error of that kernel: there is
no fallback to the installed release. Without ``upstream_src`` the installed release's module
is used, and a kernel it lacks is an error naming ``--upstream-src``.
"""

from __future__ import annotations

import ast
import atexit
import hashlib
import importlib
import importlib.util
import re
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

ATTN_PKG = "sglang.kernels.ops.attention"
PRIVATE_PKG = "bench_upstream_src"
# kernel name -> (module of ATTN_PKG, entry point)
KERNELS = {
    "splitkv": ("verify_splitkv", "verify_splitkv_fwd"),
    "shared_kv": ("verify_mla", "verify_shared_kv_fwd"),
}
# module -> modules of ATTN_PKG it imports (loaded first, from the same source)
MODULE_DEPS = {"verify_splitkv": (), "verify_mla": ("verify_splitkv",)}


class UpstreamLoadError(RuntimeError):
    """A kernel module that cannot be loaded as asked (one-line message)."""


@dataclass
class UpstreamKernel:
    """Where one kernel came from. ``fn`` is None when ``error`` says why it is not available.
    ``origin``: ``installed`` or ``source``; ``version``: the SGLang version of the file;
    ``path``: the module file; ``sha256``: of its bytes; ``imports``: the ``sglang`` names it
    imports and where each resolved (``module.name <- installed 0.5.16`` / ``<- source``);
    ``archive``: the tarball it was extracted from and its MANIFEST's first line, if any."""

    name: str
    module: str
    entry: str
    origin: str
    version: str | None = None
    path: str | None = None
    sha256: str | None = None
    imports: list = field(default_factory=list)
    archive: str | None = None
    error: str | None = None
    fn: Callable | None = None
    mod: object = None

    def record(self) -> dict:
        """The JSON-able provenance (no function or module objects)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("fn", "mod")}


def installed_version() -> str:
    """The installed SGLang's version string ('-' if it has none)."""
    try:
        import sglang

        return str(getattr(sglang, "__version__", "-"))
    except Exception as e:  # noqa: BLE001 (reported, not raised)
        return f"- ({type(e).__name__})"


def source_root(upstream_src: str, extract_dir: str | None = None) -> Path:
    """The folder holding ``sglang/`` for ``upstream_src`` (a folder that holds it or is it, or a
    tarball of it extracted into ``extract_dir`` or a new temporary folder). UpstreamLoadError
    (one line) when the path does not exist or holds no ``sglang/kernels/ops/attention``."""
    p = Path(upstream_src)
    if not p.exists():
        raise UpstreamLoadError(f"--upstream-src {upstream_src}: no such file or folder")
    if p.is_file():
        if not tarfile.is_tarfile(p):
            raise UpstreamLoadError(f"--upstream-src {upstream_src}: neither a folder nor a tarball")
        if extract_dir:
            out = Path(extract_dir)
        else:  # removed when this process exits
            out = Path(tempfile.mkdtemp(prefix="bench_upstream_src_"))
            atexit.register(shutil.rmtree, out, True)
        with tarfile.open(p) as tf:
            bad = [m.name for m in tf.getmembers() if m.name.startswith("/") or ".." in Path(m.name).parts
                   or not (m.isfile() or m.isdir())]
            if bad:
                raise UpstreamLoadError(f"--upstream-src {upstream_src}: unsafe member {bad[0]!r}")
            tf.extractall(out)
        p = out
    if (p / "sglang" / "kernels" / "ops" / "attention").is_dir():
        return p
    if p.name == "sglang" and (p / "kernels" / "ops" / "attention").is_dir():
        return p.parent
    raise UpstreamLoadError(f"--upstream-src {upstream_src}: no sglang/kernels/ops/attention under it")


def source_version(root: Path) -> str | None:
    """``__version__`` of ``root/sglang/_version.py`` (or ``version.py``) read as text, else None."""
    for name in ("_version.py", "version.py"):
        f = root / "sglang" / name
        if f.is_file():
            m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", f.read_text())
            if m:
                return m.group(1)
    return None


def sglang_imports(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` of every ``from sglang... import names`` / ``import sglang...`` in the
    module text (names empty for a plain import)."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] == "sglang":
            out.append((node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names if a.name.split(".")[0] == "sglang"]
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_source_module(root: Path, module: str, loaded: dict, inst_ver: str) -> tuple[object, list]:
    """Execute ``root/sglang/kernels/ops/attention/<module>.py`` as ``bench_upstream_src.<module>``
    (its ATTN_PKG dependencies first); returns (module, resolved imports)."""
    if module in loaded:
        return loaded[module]
    for dep in MODULE_DEPS.get(module, ()):
        _load_source_module(root, dep, loaded, inst_ver)
    path = root / "sglang" / "kernels" / "ops" / "attention" / f"{module}.py"
    if not path.is_file():
        raise UpstreamLoadError(f"{path}: not in the upstream source")
    text = path.read_text()
    resolved, alias = [], {}
    for imp, names in sglang_imports(text):
        short = imp[len(ATTN_PKG) + 1:] if imp.startswith(ATTN_PKG + ".") else None
        if short in loaded:
            alias[imp] = loaded[short][0]
            resolved.append(f"{imp}.{','.join(names) or '*'} <- source")
            continue
        try:
            m = importlib.import_module(imp)
        except Exception as e:  # noqa: BLE001
            raise UpstreamLoadError(f"{path.name} imports {imp}, which installed sglang {inst_ver} cannot "
                                    f"import ({type(e).__name__}: {str(e)[:120]})") from None
        missing = [n for n in names if not hasattr(m, n)]
        if missing:
            raise UpstreamLoadError(f"{path.name} imports {imp}.{missing[0]}, which installed sglang "
                                    f"{inst_ver} lacks")
        resolved.append(f"{imp}.{','.join(names) or '*'} <- installed {inst_ver}")
    if PRIVATE_PKG not in sys.modules:
        pkg = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(PRIVATE_PKG, None, is_package=True))
        pkg.__path__ = []
        sys.modules[PRIVATE_PKG] = pkg
    name = f"{PRIVATE_PKG}.{module}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    saved = {k: sys.modules.get(k) for k in alias}
    sys.modules[name] = mod
    try:
        sys.modules.update(alias)  # the source copies, for this module's own imports only
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001
        sys.modules.pop(name, None)
        raise UpstreamLoadError(f"{path}: executing it failed: {type(e).__name__}: {str(e)[:160]}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    loaded[module] = (mod, resolved)
    return loaded[module]


def load_kernels(names=tuple(KERNELS), upstream_src: str | None = None,
                 extract_dir: str | None = None) -> dict[str, UpstreamKernel]:
    """``{name: UpstreamKernel}`` for the kernels ``names`` (keys of :data:`KERNELS`): from
    ``upstream_src`` when given (every one of them; an error per kernel that fails, no fallback),
    else from the installed SGLang. Raises ValueError (one line) for an unknown name;
    UpstreamLoadError for an ``upstream_src`` that is no SGLang source (see :func:`source_root`)."""
    bad = [n for n in names if n not in KERNELS]
    if bad:
        raise ValueError(f"unknown upstream kernel {bad[0]!r}; known: {', '.join(KERNELS)}")
    inst_ver = installed_version()
    out = {}
    root = source_root(upstream_src, extract_dir) if upstream_src else None
    ver = source_version(root) if root else None
    archive = None
    if root and Path(upstream_src).is_file():
        man = root / "MANIFEST"
        archive = f"{upstream_src}" + (f" ({man.read_text().splitlines()[0]})" if man.is_file() else "")
    loaded: dict = {}
    for n in names:
        module, entry = KERNELS[n]
        k = UpstreamKernel(n, module, entry, "source" if root else "installed")
        try:
            if root:
                path = root / "sglang" / "kernels" / "ops" / "attention" / f"{module}.py"
                k.version, k.path, k.archive = ver, str(path), archive
                k.sha256 = _sha256(path) if path.is_file() else None
                mod, k.imports = _load_source_module(root, module, loaded, inst_ver)
            else:
                k.version = inst_ver
                try:
                    mod = importlib.import_module(f"{ATTN_PKG}.{module}")
                except ModuleNotFoundError as e:
                    if e.name != f"{ATTN_PKG}.{module}":
                        raise
                    raise UpstreamLoadError(f"installed sglang {inst_ver} has no {ATTN_PKG}.{module} "
                                            f"(pass --upstream-src with a release that has it)") from None
                k.path = mod.__file__
                k.sha256 = _sha256(Path(mod.__file__))
            fn = getattr(mod, entry, None)
            if fn is None:
                raise UpstreamLoadError(f"{k.path} has no {entry}")
            k.fn, k.mod = fn, mod
        except UpstreamLoadError as e:
            k.error = str(e)
        out[n] = k
    return out


def describe(kernels: dict[str, UpstreamKernel]) -> list[str]:
    """One line per kernel: name, entry, origin, version, path (or its error)."""
    lines = []
    for k in kernels.values():
        if k.error:
            lines.append(f"UPSTREAM {k.name} {k.entry}: ERROR {k.error}")
        else:
            lines.append(f"UPSTREAM {k.name} {k.entry}: {k.origin} sglang {k.version} {k.path} "
                         f"sha256 {k.sha256[:12]}; imports: {'; '.join(k.imports) or 'none'}"
                         + (f"; from {k.archive}" if k.archive else ""))
    return lines
