"""Families: what to build, found by name in the ``families/`` folder.

A family is data (``families/<name>/family.json``): the checkpoint, the input, the
preprocessing (the one source: make checks it against timm's pretrained config), the
precisions, the FP8 recipe with its variants (which ops: Conv, MatMul, Gemm;
``bundler.graphs.fp8``) and each engine target's build settings (``torch_aoti``,
``tensorrt``: sections this module does not read; each target's settings module checks
and reads its own, ``Family.target_settings``).
Numbers live in the spec, behaviour in ``bundler``; so adding a family is adding a folder,
and nothing here changes. Where data cannot say something, a family may add
``families/<name>/family.py`` with any of the functions in ``HOOKS``, imported only when
asked for (``Family.hook``):

* ``create_model(family) -> torch.nn.Module``: the unfolded model (default:
  ``timm.create_model(checkpoint.timm_model)``);
* ``fold_batchnorm(model) -> int``: fold what the generic Conv+BatchNorm rule does not
  (runs before it; returns how many it folded);
* ``nhwc_module(name, module, dtype) -> torch.nn.Module | None``: the torch-aoti NHWC
  replacement of a module the generic layout rules do not know.

The folder ships as package data ``bundler.family_data``; in a source checkout it is the
repository's ``families/``. Families kept elsewhere (a team's own, a test's) are found
through a search path: the folders of ``families_path(...)`` (a context manager, for
library users and tests), then those of ``$TRT_BUNDLE_FAMILIES_PATH`` (``os.pathsep``
separated), then the shipped folder; the first folder holding ``<name>/family.json`` wins.
This module imports neither torch nor onnx: ``bundle families`` and the runtime-side tools
stay light.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from runtime_py.errors import FamilyError

__all__ = [
    "Family",
    "Checkpoint",
    "InputSpec",
    "BatchRange",
    "families_root",
    "families_path",
    "family_roots",
    "list_families",
    "load_family",
    "RULE_KEYS",
    "KNOWN_PRECISIONS",
]

SPEC_FILE = "family.json"
#: Folders of families searched before the shipped ones (``os.pathsep`` separated).
FAMILIES_PATH_ENV = "TRT_BUNDLE_FAMILIES_PATH"
#: The package the ``families/`` folder ships as (see pyproject.toml).
DATA_PACKAGE = "bundler.family_data"
EXTENSION_FILE = "family.py"
MIN_OPSET = 19
KNOWN_PRECISIONS = ("fp32", "fp16", "fp8")
#: The functions a family's ``family.py`` may define (module docstring).
HOOKS = ("create_model", "fold_batchnorm", "nhwc_module")
#: Keys a layer-selection rule may use (their meaning: ``bundler.graphs.fp8``).
RULE_KEYS = frozenset({"op_type", "kernel_shape", "group", "depthwise", "module_prefix", "name_regex"})
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_REVISION_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Checkpoint:
    """Where the pretrained weights come from, pinned: the hub revision (a commit, never a
    branch) where it is known; else the checkpoint file's sha256 (``sha256``, or recorded
    at the first make and checked on every later one: ``bundler.weights``)."""

    hf_id: str
    revision: str | None
    timm_model: str
    sha256: str | None = None


@dataclass(frozen=True)
class BatchRange:
    """The batch sizes an engine accepts; ``opt`` is what TensorRT tunes for."""

    min: int
    opt: int
    max: int


@dataclass(frozen=True)
class InputSpec:
    """The model's one image input, NCHW float32."""

    name: str
    channels: int
    height: int
    width: int
    batch: BatchRange

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W): the shape of one preprocessed image."""
        return (self.channels, self.height, self.width)


@dataclass(frozen=True)
class Family:
    """A validated family spec. ``spec`` is the whole JSON (read-only), for fields the
    typed attributes do not cover."""

    name: str
    version: str
    checkpoint: Checkpoint
    input: InputSpec
    output_name: str
    num_classes: int
    precisions: tuple[str, ...]
    opset: int
    preprocessing: Mapping[str, Any]
    fp8: Mapping[str, Any] | None
    variants: Mapping[str, Mapping[str, Any]]
    path: Path = field(compare=False)
    spec: Mapping[str, Any] = field(repr=False, compare=False)

    def preprocessing_spec(self) -> dict[str, Any]:
        """The preprocessing spec as plain data (``schemas/preprocess.schema.json``)."""
        return _thaw(self.preprocessing)

    def recipe(self, variant: str | None = None) -> dict[str, Any]:
        """The FP8 recipe as plain data, with ``variant``'s rules merged in.

        A variant adds its ``include``/``exclude`` rules to the base ones and may set
        ``expected_count``. Raises ``FamilyError`` for an unknown variant or a family
        without an FP8 recipe.
        """
        if self.fp8 is None:
            raise FamilyError(f"family {self.name!r} has no fp8 recipe; its precisions are {list(self.precisions)}")
        recipe = _thaw(self.fp8)
        recipe.setdefault("select", {}).setdefault("exclude", [])
        recipe["variant"] = variant
        if variant is None:
            return recipe
        if variant not in self.variants:
            known = ", ".join(sorted(self.variants)) or "none"
            raise FamilyError(f"family {self.name!r} has no variant {variant!r} (known: {known})")
        extra = _thaw(self.variants[variant])
        recipe["select"]["include"] = list(recipe["select"]["include"]) + extra.get("include", [])
        recipe["select"]["exclude"] = list(recipe["select"]["exclude"]) + extra.get("exclude", [])
        if "expected_count" in extra:
            recipe["expected_count"] = extra["expected_count"]
        else:
            recipe.pop("expected_count", None)
        return recipe

    def recipe_digest(self, variant: str | None = None) -> str:
        """sha256 of the canonical JSON of ``recipe(variant)``: what the manifest records."""
        canonical = json.dumps(self.recipe(variant), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def class_ids(self) -> list[str] | None:
        """The dataset's class ids in class-index order (ImageNet synsets such as
        ``n01440764``), from the file the spec's ``class_ids`` names; None without one.

        The bundle's ``labels.msgpack`` holds human-readable names, which per-class folders
        of a data set are not named by; these ids are.
        """
        name = self.spec.get("class_ids")
        if name is None:
            return None
        path = self.path / name
        try:
            ids = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                   if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise FamilyError(f"family {self.name!r}: cannot read its class ids {path}: {exc}") from None
        if len(ids) != self.num_classes or len(set(ids)) != len(ids):
            raise FamilyError(f"family {self.name!r}: {path} must list {self.num_classes} distinct "
                              f"class ids, one a line (found {len(ids)}, {len(set(ids))} distinct)")
        return ids

    def target_settings(self, backend: str) -> Any:
        """The family's settings for engine target ``backend``: its section of family.json
        as that target reads it (``EngineTarget.settings_path``: torch-aoti's
        ``TorchAotiSettings``, tensorrt's ``TensorRTSettings``), read once."""
        from runtime_py.targets import get_target

        cache = self.__dict__.setdefault("_target_settings", {})
        if backend not in cache:
            module = get_target(backend).settings_module()
            if module is None:
                raise FamilyError(f"the {backend} target reads no family settings")
            cache[backend] = module.from_section(self.spec.get(module.SECTION))
        return cache[backend]

    def hook(self, name: str) -> Any:
        """The function ``name`` of the family's ``family.py`` (``HOOKS``), or None."""
        if name not in HOOKS:
            raise FamilyError(f"{name!r} is not a family hook; hooks: {', '.join(HOOKS)}")
        return getattr(self.extension(), name, None)

    def extension(self) -> ModuleType | None:
        """The family's optional ``family.py``, imported on first use; ``None`` if absent."""
        cached = self.__dict__.get("_extension", _UNSET)
        if cached is not _UNSET:
            return cached
        module = _import_extension(self.name, self.path / EXTENSION_FILE)
        object.__setattr__(self, "_extension", module)
        return module


_UNSET = object()


def families_root() -> Path:
    """The folder holding the family folders.

    The package data ``bundler.family_data`` (the repository's ``families/``, mapped by
    ``pyproject.toml``; in an editable install or a wheel) when it resolves, else the
    repository's ``families/`` next to this package (a plain source checkout).
    """
    candidates: list[Path] = []
    try:
        resource = importlib.resources.files(DATA_PACKAGE)
        if resource.is_dir():
            candidates.append(Path(str(resource)))
    except (TypeError, ModuleNotFoundError, NotADirectoryError):
        pass  # not installed: fall back to the checkout's folder
    candidates.append(Path(__file__).resolve().parents[1] / "families")
    for candidate in candidates:
        if candidate.is_dir() and any((p / SPEC_FILE).is_file() for p in candidate.iterdir() if p.is_dir()):
            return candidate
    raise FamilyError(
        "no families folder found (looked in: " + ", ".join(str(c) for c in candidates) + "); "
        "reinstall trt-bundle, or run from a source checkout"
    )


#: Folders added by ``families_path`` (innermost first); searched before the environment's.
_added_roots: tuple[Path, ...] = ()


@contextmanager
def families_path(*folders: str | Path) -> Iterator[tuple[Path, ...]]:
    """Search ``folders`` for families (before ``$TRT_BUNDLE_FAMILIES_PATH`` and the
    shipped ones) inside the ``with`` block; yields the whole search path.

    The library's way to use a family that is not shipped (the CLI's is the environment
    variable); the previous path is restored on exit, also after an error.
    """
    global _added_roots
    added = tuple(_existing_folder(f, "families_path()") for f in folders)
    previous = _added_roots
    _added_roots = added + previous
    try:
        yield family_roots()
    finally:
        _added_roots = previous


def family_roots() -> tuple[Path, ...]:
    """The folders searched for families, in order (module docstring)."""
    from_env = tuple(_existing_folder(entry, f"${FAMILIES_PATH_ENV}")
                     for entry in os.environ.get(FAMILIES_PATH_ENV, "").split(os.pathsep) if entry)
    roots: list[Path] = []
    for root in (*_added_roots, *from_env, families_root()):
        if root not in roots:
            roots.append(root)
    return tuple(roots)


def _existing_folder(entry: str | Path, where: str) -> Path:
    """A search-path entry as an absolute folder; a missing one is refused, not skipped,
    so that a mistyped path reads as such and not as "unknown family"."""
    path = Path(entry).expanduser().resolve()
    if not path.is_dir():
        raise FamilyError(f"{where} names {entry!r}, which is not a folder: fix or remove it")
    return path


def _families_in(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / SPEC_FILE).is_file())


def list_families(root: Path | None = None) -> list[str]:
    """Names of the families found (folders holding a ``family.json``), sorted: in ``root``
    only, or on the whole search path (``family_roots``)."""
    roots = family_roots() if root is None else (Path(root),)
    return sorted({name for r in roots for name in _families_in(r)})


def load_family(name: str, root: Path | None = None) -> Family:
    """Read and validate ``<root>/<name>/family.json``, ``root`` being the given folder or
    the first on the search path (``family_roots``) that holds the family.

    Raises ``FamilyError`` naming the known families for an unknown name, and listing
    every problem (in ``problems``) for an invalid spec.
    """
    roots = family_roots() if root is None else (Path(root),)
    found = next((r for r in roots if name in _families_in(r)), None)
    if found is None:
        known = list_families(root)
        raise FamilyError(
            f"unknown family {name!r}; known families: {', '.join(known) or 'none'} "
            f"(see `bundle families`; families kept elsewhere: ${FAMILIES_PATH_ENV})"
        )
    folder = found / name
    path = folder / SPEC_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FamilyError(f"family {name!r}: cannot read {path}: {exc}") from exc
    return parse_family(data, folder=folder, expected_name=name)


def _target_settings_modules() -> list[ModuleType]:
    """The settings module of each engine target that reads a section of family.json."""
    from runtime_py.targets import TARGETS

    return [t.settings_module() for t in TARGETS if t.settings_path]


def parse_family(data: Any, *, folder: Path, expected_name: str | None = None) -> Family:
    """Validate a decoded spec and build the ``Family``; every problem is reported at once."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise FamilyError(f"family spec {folder / SPEC_FILE} must be a JSON object")
    v = _Validator(data, problems)
    name = v.string("name")
    if name is not None and not _NAME_RE.match(name):
        problems.append(f"name: {name!r} must be lowercase letters, digits and '_'")
    if expected_name is not None and name is not None and name != expected_name:
        problems.append(f"name: {name!r} differs from its folder name {expected_name!r}")
    version = v.string("version")
    if version is not None and not _VERSION_RE.match(version):
        problems.append(f"version: {version!r} must be MAJOR.MINOR.PATCH")
    ckpt = data.get("checkpoint") if isinstance(data.get("checkpoint"), dict) else {}
    revision = v.string("checkpoint.revision") if ckpt.get("revision") is not None else None
    if revision is not None and not _REVISION_RE.match(revision):
        problems.append("checkpoint.revision: must be a full 40-hex commit id (pinned, not a branch)")
    sha256 = ckpt.get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
        problems.append("checkpoint.sha256: must be 64 lowercase hex digits")
    checkpoint = Checkpoint(v.string("checkpoint.hf_id"), revision, v.string("checkpoint.timm_model"),
                            sha256)
    batch = BatchRange(v.pos_int("input.batch.min"), v.pos_int("input.batch.opt"), v.pos_int("input.batch.max"))
    if None not in (batch.min, batch.opt, batch.max) and not batch.min <= batch.opt <= batch.max:
        problems.append(f"input.batch: need min <= opt <= max, got {batch.min}, {batch.opt}, {batch.max}")
    inp = InputSpec(
        v.string("input.name"), v.pos_int("input.channels"), v.pos_int("input.height"), v.pos_int("input.width"), batch
    )
    output_name = v.string("output.name")
    if output_name is not None and output_name == inp.name:
        problems.append("output.name: must differ from input.name")
    num_classes = v.pos_int("num_classes")
    precisions = v.get("precisions", list)
    if precisions is not None:
        bad = [p for p in precisions if p not in KNOWN_PRECISIONS]
        if bad or not precisions:
            problems.append(f"precisions: {precisions!r} must be a non-empty subset of {list(KNOWN_PRECISIONS)}")
    opset = v.get("opset", int)
    if opset is not None and opset < MIN_OPSET:
        problems.append(f"opset: {opset} is below {MIN_OPSET} (FP8 Q/DQ needs opset >= {MIN_OPSET})")
    preprocessing = v.get("preprocessing", dict)
    if preprocessing is not None and inp.channels is not None:
        normalize = preprocessing.get("normalize")
        for key in ("mean", "std"):
            values = normalize.get(key) if isinstance(normalize, dict) else None
            if not (isinstance(values, list) and len(values) == inp.channels):
                problems.append(f"preprocessing.normalize.{key}: must list one number per channel ({inp.channels})")
        if inp.name is not None and preprocessing.get("input") != inp.name:
            problems.append(f"preprocessing.input: must name the model input {inp.name!r}")
    # each engine target checks its own section (torch_aoti, tensorrt): bundler.targets
    for module in _target_settings_modules():
        problems += module.section_problems(data.get(module.SECTION, {}), batch)
    class_ids = data.get("class_ids")
    if class_ids is not None and not (isinstance(class_ids, str) and re.fullmatch(r"[\w.-]+", class_ids)):
        problems.append("class_ids: must name a file in the family's folder")
    fp8 = data.get("fp8")
    if precisions and "fp8" in precisions and fp8 is None:
        problems.append("fp8: the precisions include fp8, so the spec needs an fp8 recipe")
    if fp8 is not None:
        _check_recipe(fp8, "fp8", problems, require_include=True)
    variants = data.get("variants", {})
    if not isinstance(variants, dict):
        problems.append("variants: must be an object (variant name -> rules)")
        variants = {}
    for vname, variant in variants.items():
        where = f"variants.{vname}"
        if not isinstance(variant, dict):
            problems.append(f"{where}: must be an object")
            continue
        if variant.get("precision") not in (precisions or []):
            problems.append(f"{where}.precision: must be one of the family's precisions")
        elif variant.get("precision") == "fp8" and fp8 is None:
            problems.append(f"{where}: an fp8 variant needs the fp8 recipe")
        _check_recipe({"select": variant}, where, problems, require_include=False)
    if problems:
        label = expected_name or name or str(folder)
        raise FamilyError(
            f"family {label!r} has an invalid spec ({folder / SPEC_FILE}): " + "; ".join(problems),
            problems=problems,
        )
    return Family(
        name=name,
        version=version,
        checkpoint=checkpoint,
        input=inp,
        output_name=output_name,
        num_classes=num_classes,
        precisions=tuple(precisions),
        opset=opset,
        preprocessing=_freeze(preprocessing),
        fp8=_freeze(fp8) if fp8 is not None else None,
        variants=_freeze(variants),
        path=folder,
        spec=_freeze(data),
    )


def _check_recipe(recipe: Any, where: str, problems: list[str], *, require_include: bool) -> None:
    if not isinstance(recipe, dict):
        problems.append(f"{where}: must be an object")
        return
    select = recipe.get("select")
    if not isinstance(select, dict):
        problems.append(f"{where}.select: must be an object with 'include' (and 'exclude') rule lists")
        return
    for kind in ("include", "exclude"):
        rules = select.get(kind, [])
        if not isinstance(rules, list) or (kind == "include" and require_include and not rules):
            problems.append(f"{where}.select.{kind}: must be a {'non-empty ' if kind == 'include' else ''}list of rules")
            continue
        for i, rule in enumerate(rules):
            problems.extend(f"{where}.{kind}[{i}]: {p}" for p in _rule_problems(rule))
    count = recipe.get("expected_count") if where == "fp8" else select.get("expected_count")
    if count is not None and not (isinstance(count, int) and count > 0):
        problems.append(f"{where}.expected_count: must be a positive integer")


def _rule_problems(rule: Any) -> Iterable[str]:
    if not isinstance(rule, dict) or not rule:
        yield "a rule must be a non-empty object"
        return
    unknown = sorted(set(rule) - RULE_KEYS)
    if unknown:
        yield f"unknown rule key(s) {unknown}; known: {sorted(RULE_KEYS)}"
    ks = rule.get("kernel_shape")
    if ks is not None and not (isinstance(ks, list) and ks and all(isinstance(k, int) and k > 0 for k in ks)):
        yield "kernel_shape must be a list of positive integers"
    if "group" in rule and not (isinstance(rule["group"], int) and rule["group"] > 0):
        yield "group must be a positive integer"
    if "depthwise" in rule and not isinstance(rule["depthwise"], bool):
        yield "depthwise must be true or false"
    for key in ("op_type", "module_prefix", "name_regex"):
        if key in rule and not isinstance(rule[key], str):
            yield f"{key} must be a string"
    if isinstance(rule.get("name_regex"), str):
        try:
            re.compile(rule["name_regex"])
        except re.error as exc:
            yield f"name_regex is not a valid regular expression: {exc}"


class _Validator:
    """Reads dotted keys from the spec, recording a problem instead of raising."""

    def __init__(self, data: dict[str, Any], problems: list[str]) -> None:
        self.data = data
        self.problems = problems

    def get(self, dotted: str, kind: type) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                self.problems.append(f"{dotted}: missing")
                return None
            node = node[part]
        if not isinstance(node, kind) or (kind is int and isinstance(node, bool)):
            self.problems.append(f"{dotted}: must be {_KIND_NAMES.get(kind, kind.__name__)}, got {node!r}")
            return None
        return node

    def string(self, dotted: str) -> Any:
        value = self.get(dotted, str)
        if value == "":
            self.problems.append(f"{dotted}: must not be empty")
        return value

    def pos_int(self, dotted: str) -> Any:
        value = self.get(dotted, int)
        if value is not None and value <= 0:
            self.problems.append(f"{dotted}: must be a positive integer, got {value}")
            return None
        return value


_KIND_NAMES = {str: "a string", int: "an integer", dict: "an object", list: "a list"}


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _import_extension(family_name: str, path: Path) -> ModuleType | None:
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"trt_bundle_family_{family_name}", path)
    if spec is None or spec.loader is None:
        raise FamilyError(f"family {family_name!r}: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise FamilyError(f"family {family_name!r}: {path} failed to import: {exc}") from exc
    return module
