"""The `bundle` command: thin click shells over library functions.

Every command is usable from Python without the CLI (the functions it calls are public).
A `BundleError` becomes `error: <message>` on stderr and the error's exit code; any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from runtime_py.errors import EXIT_CODES_HELP, BundleError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def handle_errors(func):
    """Turn BundleErrors into one line on stderr and the error's exit code."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except BundleError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
    return wrapper


def echo_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@click.group(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.version_option(package_name="trt-bundle", prog_name="bundle")
def cli() -> None:
    """Make, check and serve deployment bundles of vision models.

    A bundle is one file: the engine (ONNX Runtime graph, TensorRT plan or AOTInductor
    package), its preprocessing, FP8 calibration scales, reference inputs/outputs, and a
    manifest whose sha256 is the bundle's id.
    """


# --- inspect / verify --------------------------------------------------------------------

@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@handle_errors
def inspect(path: str, as_json: bool) -> None:
    """Show a bundle's id, family, precision, target, tensors, members and provenance.

    Checks the header, the manifest against the id and the manifest schema; it does not
    decompress members (use `bundle verify` for that).
    """
    from bundler.inspect import inspect_summary

    summary = inspect_summary(path)
    if as_json:
        echo_json(summary)
        return
    for line in format_summary(summary):
        click.echo(line)


def format_summary(s: dict) -> list[str]:
    """Human-readable lines of an inspect summary."""
    eng = s["engine"]
    src = s["source"]
    lines = [f"bundle   {s['name']}", f"id       {s['id']}",
             f"format   {s['format']['major']}.{s['format']['minor']}",
             f"family   {s['family']['name']} {s['family']['version']}",
             f"precision {s['precision']}" + (f" (variant {s['variant']})" if s["variant"] else "")]
    if src["kind"] == "random-weights":
        lines.append(f"weights  RANDOM WEIGHTS (seed {src['seed']}): a smoke-test bundle, "
                     "not a trained model")
    else:
        lines.append(f"weights  {src['id']}@{src.get('revision', '?')} {src['sha256']}")
    lines.append(f"engine   {eng['backend']} ({eng['member']})")
    for key, value in sorted(eng["details"].items()):
        lines.append(f"           {key}: {value}")
    b = s["batch"]
    lines.append(f"batch    {b['min']}..{b['max']} (opt {b['opt']})")
    for kind in ("inputs", "outputs"):
        for t in s[kind]:
            lines.append(f"{kind[:-1]:<8} {t['name']} {t['dtype']} {t['shape']}")
    if s.get("recipe"):
        r = s["recipe"]
        lines.append(f"recipe   {r['name']} {r['digest']} ({r['quantized_layers']} layers)")
    if s.get("calibration"):
        c = s["calibration"]
        lines.append(f"calib    {c['method']} on {c['images']} images from {c['data_source']} "
                     f"({c['data_digest'][:19]}...)")
    if s.get("quality"):
        q = s["quality"]
        lines.append(f"quality  vs {q['reference']} on {q['images']} inputs: top-1 agreement "
                     f"{q['top1_agreement']}, KL mean {q['kl_mean']}, max |diff| "
                     f"{q['max_abs_diff']}, NaN {q['nan_count']}, Inf {q['inf_count']}")
    if s.get("rebuilt_from"):
        lines.append(f"rebuilt from {s['rebuilt_from']}")
    bld = s["build"]
    lines.append(f"built by {bld['tool']} {bld['tool_version']}"
                 + (f", SOURCE_DATE_EPOCH={bld['source_date_epoch']}"
                    if bld["source_date_epoch"] is not None else ""))
    if bld["packages"]:
        lines.append("packages " + ", ".join(f"{k} {v}" for k, v in sorted(bld["packages"].items())))
    lines.append(f"members  ({_human_size(s['file_size'])} file)")
    for m in s["members"]:
        lines.append(f"  {m['name']:<26} {_human_size(m['raw_size']):>11} raw "
                     f"{_human_size(m['stored_size']):>11} stored  x{m['ratio']}")
    return lines


@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--numerics", is_flag=True,
              help="Also run the reference inputs through the bundle's engine and compare "
                   "with the stored outputs (needs the engine on this host).")
@click.option("--backend", default=None,
              help="With --numerics: run on this backend instead of the bundle's own "
                   "(onnxruntime runs the portable model.onnx of any bundle).")
@handle_errors
def verify(path: str, as_json: bool, numerics: bool, backend: str | None) -> None:
    """Check structure, schema, every member hash and the bundle id.

    Exit 0 when sound; exit 1 with one line per problem otherwise.
    """
    from bundler.inspect import verify_report

    report = verify_report(path, numerics=numerics, backend=backend)
    if as_json:
        echo_json(report)
    elif report["ok"]:
        extra = " (RANDOM WEIGHTS smoke bundle)" if report.get("random_weights") else ""
        click.echo(f"ok {report['id']} {path}{extra}")
        for check in report["checks"]:
            click.echo(f"  checked: {check}")
    else:
        for problem in report["problems"]:
            click.echo(f"{path}: {problem}", err=True)
    sys.exit(0 if report["ok"] else 1)


def main() -> None:
    cli(prog_name="bundle")


if __name__ == "__main__":
    main()
