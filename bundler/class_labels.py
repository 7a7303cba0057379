"""Class indices of per-class image folders (`bundle eval --data DIR/<class>/<image>`,
`bundle study --eval-data DIR/<class>/<image>`; both take `--labels-from`).

Taking labels from the sorted folder order (torchvision's ImageFolder) is right only when
every class of the model is there and the folders sort like the classes: folders named
`n02123045` and `n07920052` would become classes 0 and 1 (tench, goldfish) and every
accuracy figure would be silently wrong. So the rule is explicit:

* ``auto`` (default): folders named by the family's class ids (ImageNet synsets such as
  ``n01440764``, ``families/<name>/class_ids.txt``) map to those classes; any other
  folder names are refused, with the other rules named;
* ``synsets``: the same, never guessing;
* ``folder-index``: folder names are class indices (``0`` .. ``N-1``);
* ``folder-order``: the sorted folder order (ImageFolder's rule), asked for knowingly;
* ``none``: no labels (agreement with the reference only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from runtime_py.errors import CalibrationError

if TYPE_CHECKING:                  # the CLI reads RULES: importing this stays light
    from bundler.calibration.data import ClassFolders

RULES = ("auto", "synsets", "folder-index", "folder-order", "none")
_OTHER_RULES = ("--labels-from folder-index (folder names are class indices), "
                "--labels-from folder-order (sorted folder names are classes 0, 1, ...) or "
                "--labels-from none (no labels)")


def _examples(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def class_folder_rule(rule: str, class_ids: Sequence[str] | None, num_classes: int | None,
                      option: str = "--data") -> ClassFolders:
    """The function `open_calibration_data` calls with the sorted per-class folder names.

    It returns {folder name: class index}, or None for ``none`` (unlabelled), and raises
    CalibrationError (exit 6) for names the rule cannot map, naming ``option`` (the
    command's data option) as the folder's source.
    """
    if rule not in RULES:
        raise CalibrationError(f"unknown --labels-from {rule!r}; choose one of {', '.join(RULES)}")

    def by_class_id(names: list[str]) -> dict[str, int]:
        if class_ids is None:
            raise CalibrationError(
                f"{option} has per-class folders ({_examples(names)}) and this bundle's family "
                f"lists no class ids to map them by: say how they map with {_OTHER_RULES}")
        index = {cid: i for i, cid in enumerate(class_ids)}
        unknown = [n for n in names if n not in index]
        if unknown:
            raise CalibrationError(
                f"{option} has per-class folders that are not class ids of this bundle's family "
                f"(e.g. ImageNet synsets such as {class_ids[0]!r}): {_examples(unknown)}; "
                f"rename them, or say how they map with {_OTHER_RULES}")
        return {n: index[n] for n in names}

    def by_index(names: list[str]) -> dict[str, int]:
        bad = [n for n in names if not (n.isdigit() and (num_classes is None
                                                          or int(n) < num_classes))]
        if bad:
            limit = f" 0..{num_classes - 1}" if num_classes else ""
            raise CalibrationError(f"--labels-from folder-index: folder names must be class "
                                   f"indices{limit}, got {_examples(bad)}")
        return {n: int(n) for n in names}

    def by_order(names: list[str]) -> dict[str, int]:
        return {n: i for i, n in enumerate(names)}

    def unlabelled(names: list[str]) -> None:
        return None

    return {"auto": by_class_id, "synsets": by_class_id, "folder-index": by_index,
            "folder-order": by_order, "none": unlabelled}[rule]
