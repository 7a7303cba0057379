"""The `bundle` command: thin click shells over library functions.

Every command is usable from Python without the CLI (the functions it calls are public).
A `BundleError` becomes `error: <message>` on stderr and the error's exit code; any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from bundler.class_labels import RULES as CLASS_FOLDER_RULES
from bundler.peer import PEERS
from runtime_py.batcher import EARLY_DISPATCH_RULES
from runtime_py.errors import EXIT_CODES_HELP, BundleError, MissingExtraError, UsageError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
#: `bundle serve --cudnn-benchmark`: the torch-aoti runner's ``cudnn_benchmark`` option
#: (None: as each bundle records it)
CUDNN_BENCHMARK_CHOICES = {"bundle": None, "on": True, "off": False}


def backend_choice(*, auto: bool) -> click.Choice:
    """``--backend``'s choices: the engine-target registry's names (``runtime_py.targets``),
    after ``auto`` where the command can pick one."""
    from runtime_py.targets import NAMES

    return click.Choice((["auto"] if auto else []) + list(NAMES))


def _human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def handle_errors(func):
    """Turn BundleErrors into one line on stderr and the error's exit code.

    A module of an uninstalled extra that is imported anyway (a path the command's own
    `require_extra` check did not foresee) is reported the same way, naming the extra.
    """
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except BundleError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except ModuleNotFoundError as exc:
            from runtime_py.extras import extra_for_module, install_hint

            extra = extra_for_module(exc.name or "")
            if extra is None:
                raise
            error = MissingExtraError(
                f"this command needs the '{extra}' extra, and {exc.name} is not installed: "
                f"{install_hint(extra)}", extra=extra, missing=[exc.name])
            click.echo(f"error: {error}", err=True)
            sys.exit(error.exit_code)
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
    decompress members (use `bundle verify` for that). With --json, measured values
    (ratio, top1_agreement, kl_mean...) are numbers; the manifest itself keeps them as
    decimal strings (its canonical form has no floats).
    """
    from bundler.inspect import inspect_summary, json_summary

    summary = inspect_summary(path)
    if as_json:
        echo_json(json_summary(summary))
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
    static = eng["details"].get("static_batches")
    lines.append(f"batch    {b['min']}..{b['max']} (opt {b['opt']})"
                 + (f"; a static graph for {', '.join(map(str, static))}" if static else ""))
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


def trust_options(func):
    """Who is trusted to sign: shared by `verify` (and, in part, `serve`)."""
    for option in reversed([
        click.option("--key", "keys", multiple=True, type=click.Path(path_type=Path),
                     help="Trusted public key (PEM); repeatable."),
        click.option("--trusted-keys", "trusted_dirs", multiple=True,
                     type=click.Path(path_type=Path),
                     help="Folder of trusted PEM public keys, CA certificates and CRLs "
                          "(*.pem, *.pub, *.crt, *.crl); repeatable."),
        click.option("--certificate-chain", "chains", multiple=True,
                     type=click.Path(path_type=Path),
                     help="Trusted root CA certificates (PEM) for certificate signatures."),
        click.option("--crl", "crls", multiple=True, type=click.Path(path_type=Path),
                     help="Certificate revocation list (PEM) to honour; repeatable."),
        click.option("--signature", "signature_path", type=click.Path(path_type=Path),
                     default=None, help="Signature file [default: BUNDLE.sig]."),
    ]):
        func = option(func)
    return func


def trust_from_options(keys, trusted_dirs, chains, crls, signature_path):
    """The TrustPolicy the options ask for, or None when they ask for no signature check."""
    if not (keys or trusted_dirs or chains):
        if crls or signature_path:
            raise UsageError("--crl and --signature need trust to check against: --key PUB, "
                             "--trusted-keys DIR or --certificate-chain FILE")
        return None
    from runtime_py.signing.trust import load_trust

    return load_trust([*keys, *trusted_dirs], chains, crls)


@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("path", type=click.Path(dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--numerics", is_flag=True,
              help="Also run the reference inputs through the bundle's engine and compare "
                   "with the stored outputs (needs the engine on this host).")
@click.option("--backend", default=None, type=backend_choice(auto=False),
              help="With --numerics: run on this backend instead of the bundle's own "
                   "(onnxruntime runs the portable model.onnx of any bundle).")
@trust_options
@handle_errors
def verify(path: str, as_json: bool, numerics: bool, backend: str | None, keys, trusted_dirs,
           chains, crls, signature_path) -> None:
    """Check structure, schema, every member hash and the bundle id; with trust options,
    also the detached signature (BUNDLE.sig) and who made it:

    \b
      bundle verify app.bundle --key release.pub
      bundle verify app.bundle --trusted-keys /etc/trt-bundle/trusted/ --json

    Exit 0 when sound; exit 1 with one line per problem when the bundle opens but a check
    fails; exit 8 when the bundle is sound but its signature is missing, malformed or not
    from a trusted signer; exit 3 or 4 when the file is not a readable bundle at all.
    """
    from bundler.inspect import verify_report

    trust = trust_from_options(keys, trusted_dirs, chains, crls, signature_path)
    report = verify_report(path, numerics=numerics, backend=backend, trust=trust,
                           signature_path=signature_path)
    if as_json:
        echo_json(report)
    elif report["ok"]:
        extra = " (RANDOM WEIGHTS smoke bundle)" if report.get("random_weights") else ""
        click.echo(f"ok {report['id']} {path}{extra}")
        for check in report["checks"]:
            click.echo(f"  checked: {check}")
        if report.get("signature"):
            sig = report["signature"]
            source = (f"trusted key file {sig['trusted_key_file']}" if sig["method"] == "key"
                      else f"certificate issued by {sig['certificate']['issuer']}")
            click.echo(f"  signed by: {sig['identity']} ({source}; {sig['scheme']}; signed at "
                       f"{sig['signed_at']})")
    else:
        for problem in report["problems"]:
            click.echo(problem if problem.startswith(f"{path}: ") else f"{path}: {problem}",
                       err=True)
    sys.exit(report["exit_code"])


@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("bundle_path", metavar="BUNDLE", type=click.Path(path_type=str))
@click.option("--key", required=True, type=click.Path(path_type=Path),
              help="Private key (PEM or OpenSSH; EC P-256/P-384/P-521 or Ed25519), readable "
                   "by its owner only. An encrypted key reads $TRT_BUNDLE_KEY_PASSWORD.")
@click.option("--certificate", type=click.Path(path_type=Path), default=None,
              help="Sign as this certificate (PEM) of the key: verifiers then trust a CA "
                   "instead of the key itself.")
@click.option("--certificate-chain", "chain", multiple=True, type=click.Path(path_type=Path),
              help="Intermediate CA certificates to embed with --certificate.")
@click.option("--signature", "signature_path", type=click.Path(path_type=Path), default=None,
              help="Where to write the signature [default: BUNDLE.sig].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def sign(bundle_path, key, certificate, chain, signature_path, as_json) -> None:
    """Sign a bundle: write a detached signature, BUNDLE.sig, beside it.

    The signature (a Sigstore bundle with a DSSE envelope; see docs/signing.md) covers the
    bundle id and the sha256 of the whole file. The bundle's bytes are not changed. Run
    `bundle verify` before signing: signing checks the header and the id, not every member.
    """
    from bundler.sign import sign_bundle

    result = sign_bundle(bundle_path, key, certificate=certificate, chain=tuple(chain),
                         signature_path=signature_path)
    if as_json:
        echo_json(result)
    else:
        click.echo(f"signed {result['bundle_id']} with key {result['key_fingerprint']} "
                   f"({result['scheme']})", err=True)
        click.echo(result["signature"])


#: `bundler.make.INPUT_DTYPES` (not imported here: the CLI starts without numpy and the
#: family code; tests/test_eval_study.py checks the two agree).
INPUT_DTYPES = ("float32", "uint8")


def input_dtype_option(help_text: str):
    """`--input` of `bundle make` and `bundle study`: one choice list, one default."""
    return click.option("--input", "input_dtype", default="float32", show_default=True,
                        type=click.Choice(INPUT_DTYPES), help=help_text)


def tensorrt_options(func):
    """The TensorRT build options shared by `make` and `rebuild`."""
    for option in reversed([
        click.option("--timing-cache", type=click.Path(path_type=Path), default=None,
                     help="tensorrt: persistent timing cache file (read and updated)."),
        click.option("--hardware-compat", type=click.Choice(["none", "ampere+"]), default=None,
                     help="tensorrt: build a plan that runs on any Ampere or newer GPU."),
        click.option("--version-compatible", is_flag=True, default=None,
                     help="tensorrt: build a version-compatible plan."),
        click.option("--workspace-mib", type=int, default=None,
                     help="tensorrt: workspace limit."),
    ]):
        func = option(func)
    return func


def target_options(timing_cache, hardware_compat, version_compatible, workspace_mib) -> dict:
    """Only the options given: the onnxruntime target refuses any build option."""
    return {k: v for k, v in {
        "timing_cache": timing_cache, "hardware_compat": hardware_compat,
        "version_compatible": version_compatible,
        "workspace_bytes": workspace_mib * (1 << 20) if workspace_mib else None}.items()
        if v is not None}


# --- families / make ------------------------------------------------------------------------

@cli.command(context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@handle_errors
def families(as_json: bool) -> None:
    """List the model families this install knows, and whether it can build them.

    Building needs the 'export' extra (torch, timm, onnx...); an install without it (e.g.
    `pip install 'trt-bundle[ort]'` for a service) lists the families and says what is
    missing. JSON rows carry `buildable` and `missing`.
    """
    from bundler.families import list_families, load_family
    from runtime_py.extras import install_hint, missing_modules

    missing = missing_modules("export")
    rows = []
    for name in list_families():
        fam = load_family(name)
        rows.append({"name": fam.name, "version": fam.version, "checkpoint": fam.checkpoint.hf_id,
                     "precisions": list(fam.precisions), "variants": sorted(fam.variants),
                     "buildable": not missing, "missing": missing})
    if as_json:
        echo_json(rows)
    else:
        for r in rows:
            variants = f"; variants: {', '.join(r['variants'])}" if r["variants"] else ""
            click.echo(f"{r['name']} {r['version']}  ({r['checkpoint']})  precisions: "
                       f"{', '.join(r['precisions'])}{variants}")
    if missing:
        click.echo(f"note: this install cannot build these families: the 'export' extra is "
                   f"missing ({', '.join(missing)}): {install_hint('export')}", err=True)


def print_progress(stage: str, message: str) -> None:
    click.echo(f"[{stage}] {message}", err=True)


@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP,
             short_help="Build one bundle of FAMILY at one precision.")
@click.argument("family")
@click.option("--precision", required=True, metavar="{fp32,fp16,fp8}",
              help="Precision of the graph (nvfp4 and int8 are refused with the reason).")
@click.option("--variant", default=None, help="Recipe variant, e.g. fp8-depthwise.")
@click.option("--backend", default="auto", show_default=True, type=backend_choice(auto=True),
              help="Engine target. auto: tensorrt where it is importable and a GPU is "
                   "visible, else onnxruntime.")
@click.option("--out", "out_dir", default=".", show_default=True,
              type=click.Path(path_type=Path),
              help="Output folder (created when the bundle is written).")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              help="Weights from this .safetensors file (default: the Hugging Face cache at "
                   "the family's pinned revision; nothing is downloaded).")
@click.option("--random-weights", is_flag=True,
              help="Seeded random weights: a structurally identical smoke bundle, marked so.")
@click.option("--seed", default=0, show_default=True, help="Seed for --random-weights.")
@click.option("--calib-data", type=click.Path(path_type=Path), default=None,
              help="fp8 calibration images: a folder, webdataset .tar shards (or a brace "
                   "pattern), or a .safetensors of preprocessed tensors.")
@click.option("--calib-count", default=500, show_default=True, help="Images to calibrate on.")
@click.option("--calib-stride", default=1, show_default=True, help="Take every n-th image.")
@click.option("--calibrator", "calib_method", default="max", show_default=True,
              type=click.Choice(["max", "percentile", "entropy", "mse"]),
              help="How activation amax is chosen from the collected histograms.")
@click.option("--percentile", default=99.99, show_default=True,
              help="With --calibrator percentile.")
@click.option("--reference-data", type=click.Path(path_type=Path), default=None,
              help="Images for the reference member and the quality summary (default: a "
                   "seeded synthetic set, recorded as such).")
@click.option("--reference-count", default=8, show_default=True)
@input_dtype_option("What the engine takes. uint8: the pixels after decode, resize and crop "
                    "(NHWC), with rescale, normalize, layout and cast done by the engine on "
                    "its device (4x fewer bytes to copy and send); float32: preprocessed NCHW.")
@click.option("--force", is_flag=True,
              help="Replace a bundle of the same name in --out (without it: refused, exit 6; "
                   "the same name can hold another id: other weights, data or versions).")
@click.option("--reuse", is_flag=True,
              help="If --out holds this bundle made from the same inputs (weights, data, "
                   "recipe, engine form, versions: the check `bundle study` makes), print its "
                   "id and build nothing. One made from other inputs is refused with the "
                   "difference (exit 6), or rebuilt with --force.")
@tensorrt_options
@click.option("--sign-key", type=click.Path(path_type=Path), default=None,
              help="Sign the new bundle with this private key (checked before the build); "
                   "writes BUNDLE.sig as `bundle sign` does.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def make(family: str, precision: str, variant, backend, out_dir, checkpoint, random_weights,
         seed, calib_data, calib_count, calib_stride, calib_method, percentile, reference_data,
         reference_count, input_dtype, force, reuse, timing_cache, hardware_compat,
         version_compatible, workspace_mib, sign_key, as_json) -> None:
    """Build one bundle of FAMILY at one precision, e.g.:

    \b
      bundle make timm_xception --precision fp8 --calib-data imagenet-val/ --out bundles/
      bundle make timm_xception --precision fp16 --random-weights

    Progress goes to stderr; the bundle id is printed last on stdout. --out is checked
    before any work (a file, a path under a file or a folder that cannot be written is
    refused, exit 6), and an existing bundle of the same name is replaced only with --force
    (or, with --reuse, taken as it is when it was made from the same inputs).
    The fp32 export is cached in $TRT_BUNDLE_CACHE/export (default ~/.cache/trt-bundle/export).
    Real weights: see README.md (`hf download`, the pinned revision, the cache layout).
    """
    from runtime_py.extras import require_extra

    require_extra("export", "`bundle make`")
    from bundler.make import MakeRequest, make_bundle

    signer = None
    if sign_key is not None:  # a bad key is refused now, not after minutes of build
        from bundler.sign import BundleSigner

        signer = BundleSigner.from_files(sign_key)
    req = MakeRequest(family=family, precision=precision.lower(), variant=variant,
                      backend=backend, out_dir=out_dir, checkpoint=checkpoint,
                      random_weights=random_weights, seed=seed, calib_data=calib_data,
                      calib_count=calib_count, calib_stride=calib_stride,
                      calib_method=calib_method, percentile=percentile,
                      reference_data=reference_data, reference_count=reference_count,
                      input_dtype=input_dtype,
                      replace_existing=force, reuse_existing=reuse,
                      target_options=target_options(timing_cache, hardware_compat,
                                                    version_compatible, workspace_mib))
    result = make_bundle(req, progress=None if as_json else print_progress)
    signed = signer.sign_bundle(result.path) if signer is not None else None
    if as_json:
        echo_json({"path": str(result.path), "id": result.bundle_id, "name": result.manifest["name"],
                   "quality": result.manifest["quality"], "signature": signed,
                   "reused": result.reused})
    else:
        if signed:
            print_progress("sign", f"wrote {signed['signature']} (key {signed['key_fingerprint']})")
        click.echo(result.bundle_id)


# --- rebuild -------------------------------------------------------------------------------

@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("bundle_path", metavar="BUNDLE", type=click.Path(path_type=str))
@click.option("--backend", required=True, type=backend_choice(auto=False),
              help="The new engine target, built on this host.")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              help="torch-aoti: the .safetensors checkpoint the bundle was made from (default: "
                   "the Hugging Face cache; random-weights bundles use their recorded seed).")
@click.option("--out", "out_dir", default=".", show_default=True,
              type=click.Path(path_type=Path),
              help="Output folder (created when the bundle is written).")
@click.option("--force", is_flag=True,
              help="Replace a bundle of the same name in --out (without it: refused, exit 6, "
                   "nothing written; the source bundle itself is never replaced).")
@tensorrt_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def rebuild(bundle_path, backend, checkpoint, out_dir, force, timing_cache, hardware_compat,
            version_compatible, workspace_mib, as_json) -> None:
    """A new bundle for this host from the portable ONNX of an existing one.

    Same family, precision, recipe, calibration and references; new engine target and id;
    the source bundle's id is recorded as `rebuilt_from`. A torch-aoti engine is compiled
    from the family's torch model: the weights the bundle was made from must be at hand
    (its recorded seed, the Hugging Face cache, or --checkpoint; checked against the
    manifest's sha256), else it is refused naming what to pass (exit 6). An existing
    bundle of the new name in --out is replaced only with --force.
    """
    from runtime_py.extras import require_extra

    require_extra("export", "`bundle rebuild`")
    from bundler.rebuild import rebuild_bundle

    options = target_options(timing_cache, hardware_compat, version_compatible, workspace_mib)
    path, bundle_id = rebuild_bundle(bundle_path, backend, out_dir,
                                     log=None if as_json else (lambda m: print_progress("rebuild", m)),
                                     checkpoint=checkpoint, replace_existing=force, **options)
    if as_json:
        echo_json({"path": str(path), "id": bundle_id})
    else:
        click.echo(f"wrote {path}", err=True)
        click.echo(bundle_id)


# --- serve ---------------------------------------------------------------------------------

@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("bundle_paths", metavar="BUNDLE...", nargs=-1, required=True,
                type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--max-batch", type=int, default=None,
              help="Largest merged batch (default: each bundle's max batch).")
@click.option("--max-delay-ms", default=2.0, show_default=True,
              help="How long a batch waits for more requests.")
@click.option("--max-wait-ms", type=click.FloatRange(0), default=None,
              help="How long a batch may wait for the clients of the last batch to come "
                   "back (closed-loop clients over a network return later than "
                   "--max-delay-ms; without them they split into half-empty batches). "
                   "Default: the engine's recent time per batch (up to 50 ms); "
                   "--max-wait-ms equal to --max-delay-ms turns the wait off.")
@click.option("--early-dispatch", type=click.Choice(EARLY_DISPATCH_RULES), default="off",
              is_flag=False, flag_value="on", show_default=True,
              help="on (also given alone): cap that wait where a GPU engine would run out "
                   "of work: the next batch starts, with the requests it has, when the "
                   "batch in flight is due to finish; pays behind front-ends whose round "
                   "trip outlasts a batch. auto: try both rules in turn on the live traffic "
                   "and keep whichever serves more images per second (docs/serving.md).")
@click.option("--stage-ahead/--no-stage-ahead", default=False, show_default=True,
              help="Copy a batch's rows to the GPU while the batch still collects, so that "
                   "its dispatch copies only the rows that came last (torch-aoti on a GPU; "
                   "other engines ignore it). Off: on two H100 hosts it made the served "
                   "figure worse (docs/serving.md).")
@click.option("--cuda-graph-sizes", default=None, metavar="N[,N..]",
              callback=lambda ctx, param, value: None if value is None else _int_list(value),
              help="Batch sizes that get a CUDA graph of their own (the max always does); a "
                   "batch runs on the graph of the next listed size, its extra rows padding. "
                   "Fewer sizes: a shorter start (each costs a first run, ~1.7-2.3 s for a "
                   "cuDNN-heavy fp16 package: 1,2,4,8,16,24 prepared xception fp16 in 10.7 s "
                   "against 54 s on an H100, replaying at the same speed), some rows wasted "
                   "between sizes. Sizes "
                   "above a bundle's max are dropped for it; --max-batch is added. "
                   "Default: every size. "
                   "torch-aoti on a GPU; other engines ignore it.")
@click.option("--cudnn-benchmark", type=click.Choice(list(CUDNN_BENCHMARK_CHOICES)),
              default="bundle", show_default=True,
              help="Whether each CUDA graph's warm-up times cuDNN's algorithms "
                   "(torch.backends.cudnn.benchmark), so that the graph captures the "
                   "fastest: bundle: as the bundle records it (family.json "
                   "torch_aoti.cudnn_benchmark); on / off: for every bundle. The faster "
                   "choice depends on the model and the card: on an H100 timing made "
                   "timm_xception's fp16 4-5% faster at batch 32 and timm_resnet50's 4% "
                   "slower. torch-aoti on a GPU; other engines ignore it.")
@click.option("--max-queue", default=1024, show_default=True,
              help="Queued requests per model before 503 (back-pressure).")
@click.option("--backend", default="auto", show_default=True, type=backend_choice(auto=True),
              help="Engine for every bundle (auto: its own target when this host can).")
@click.option("--threads", type=int, default=None, help="onnxruntime intra-op threads.")
@click.option("--trusted-keys", "trusted_dirs", multiple=True, type=click.Path(path_type=Path),
              help="Serve only bundles signed by these keys / CAs: a folder of PEM public keys, "
                   "CA certificates and CRLs (or a key file); repeatable. Each BUNDLE.sig is "
                   "checked before its engine starts.")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve KServe v2 gRPC (tritonclient.grpc) on this port (0: any free "
                   "port). Off when not given.")
@click.option("--workers", type=click.IntRange(0, 64), default=None,
              help="Front-end processes that parse HTTP/gRPC and hand tensors to the one "
                   "engine process through shared memory; 0 parses in the engine process. "
                   "Default: from the CPU count.")
@click.option("--max-body-mb", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Largest HTTP body / gRPC message accepted (413 / RESOURCE_EXHAUSTED).")
@click.option("--http-server", type=click.Choice(["builtin", "uvicorn"]), default="builtin",
              show_default=True,
              help="HTTP/1.1 server: builtin reads an inference body from the socket straight "
                   "into the buffer the engine reads (in a worker, its shared arena) and "
                   "answers in one write; uvicorn serves every request through ASGI. Both "
                   "serve the same routes.")
@click.option("--grpc-server", type=click.Choice(["builtin", "grpcio"]), default="builtin",
              show_default=True,
              help="gRPC server (with --grpc-port): builtin speaks HTTP/2 on the event loop "
                   "and receives a message straight into the buffer the engine reads, and "
                   "with --workers its connections are dealt out evenly; grpcio is grpc's "
                   "own asyncio server. Both serve the same service.")
@handle_errors
def serve(bundle_paths, host, port, max_batch, max_delay_ms, max_wait_ms, early_dispatch,
          stage_ahead, cuda_graph_sizes, cudnn_benchmark, max_queue, backend, threads,
          trusted_dirs, grpc_port, workers, max_body_mb, http_server, grpc_server) -> None:
    """Serve bundles: the KServe v2 inference protocol over HTTP (and gRPC).

    \b
    GET  /v2/health/live, /v2/health/ready, /v2, /v2/models/{name}[/ready]
    GET  /v2/models/{name}/config, /v2/models[/{name}]/stats   (Triton extensions)
    POST /v2/repository/index
    POST /v2/models/{name}/infer      JSON tensors, binary tensors or shared memory
    POST /v2/models/{name}/classify   an encoded image as the body -> top-k labels
    *    /v2/systemsharedmemory/...   register / status / unregister regions
    GET  /metrics                     Prometheus metrics
    gRPC inference.GRPCInferenceService on --grpc-port (tritonclient.grpc).
    Each bundle is verified and loaded first; a model's name is its bundle name without
    the target part (e.g. timm_xception-fp8-1.0.0). Then each model is prepared for every
    batch size up to its max (a GPU engine's first run and CUDA graph at each size: up to
    a minute for a cuDNN-heavy fp16 package; its progress is printed). "serving on ..." is
    printed once every port is bound; a port in use exits with 7.
    """
    from runtime_py.extras import require_extra

    require_extra("serve", "`bundle serve`")
    import runtime_py
    from runtime_py.server.engine import is_random_weights
    from runtime_py.server.run import capped_max_batch, default_workers
    from runtime_py.server.run import serve as run_server

    trust = None
    if trusted_dirs:
        from runtime_py.signing.trust import load_trust

        trust = load_trust(trusted_dirs)
    # the torch-aoti runner's options, only those given (other engines' loads stay as
    # they were); --max-batch among the graph sizes: the largest batches get a graph
    runner_options: dict[str, object] = {}
    if cuda_graph_sizes is not None:
        runner_options["cuda_graph_sizes"] = [*cuda_graph_sizes,
                                              *([max_batch] if max_batch else [])]
    if CUDNN_BENCHMARK_CHOICES[cudnn_benchmark] is not None:
        runner_options["cudnn_benchmark"] = CUDNN_BENCHMARK_CHOICES[cudnn_benchmark]
    models = []
    try:
        for path in bundle_paths:
            model = runtime_py.load(path, backend=backend, intra_op_threads=threads,
                                    trusted_keys=trust, **runner_options)
            models.append(model)
            click.echo(f"loaded {model.name} ({model.backend}, {model.id[:16]}) from {path}",
                       err=True)
            if is_random_weights(model):
                click.echo(f"warning: {model.name} has RANDOM WEIGHTS (made with "
                           f"--random-weights): its predictions mean nothing; its metadata "
                           f"says random_weights", err=True)
            capped = capped_max_batch(max_batch, model)
            if capped is not None and capped < max_batch:
                click.echo(f"note: --max-batch {max_batch} capped to {capped} for "
                           f"{model.name} (the engine's max batch size)", err=True)
        n_workers = default_workers() if workers is None else workers

        def ready(addresses: dict) -> None:
            where = addresses["http"] + (f" and gRPC {addresses['grpc']}"
                                         if "grpc" in addresses else "")
            mode = f"{n_workers} front-end workers" if n_workers else "in-process front-end"
            click.echo(f"serving on {where} ({mode}; Ctrl-C stops)", err=True)

        run_server(models, host=host, port=port, max_batch=max_batch,
                   max_delay_ms=max_delay_ms, max_wait_ms=max_wait_ms,
                   early_dispatch=early_dispatch, stage_ahead=stage_ahead,
                   max_queue=max_queue, grpc_port=grpc_port,
                   workers=n_workers, max_body_bytes=max_body_mb * 1024 * 1024,
                   http_server=http_server, grpc_server=grpc_server, on_ready=ready,
                   on_progress=lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        pass
    finally:
        for model in models:
            model.close()


# --- bench ---------------------------------------------------------------------------------

def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise click.BadParameter("batch sizes must be positive integers")
    return values


@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("bundle_path", metavar="BUNDLE", type=click.Path(path_type=str))
@click.option("--batch-sizes", default="1,8,32", show_default=True, help="Comma-separated.")
@click.option("--concurrency", type=int, default=None,
              help="Also measure N concurrent single-image clients through the batcher.")
@click.option("--backend", default="auto", show_default=True, type=backend_choice(auto=True),
              help="Engine to run (auto: the bundle's own target when this host can).")
@click.option("--threads", type=int, default=None, help="onnxruntime intra-op threads.")
@click.option("--min-seconds", default=1.0, show_default=True, help="Per figure.")
@click.option("--no-end-to-end", is_flag=True, help="Skip the preprocessing figures.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@handle_errors
def bench(bundle_path, batch_sizes, concurrency, backend, threads, min_seconds, no_end_to_end,
          as_json) -> None:
    """Latency and throughput of a bundle, each figure with its measurement boundary.

    \b
    engine      the engine call on host arrays
    copies      engine + host<->device copies (GPU engines; n/a on CPU)
    end_to_end  JPEG decode + preprocessing + engine
    served      N concurrent single-image clients through the dynamic batcher
    Progress goes to stderr (also with --json, whose stdout holds only the JSON).
    """
    import runtime_py
    from runtime_py.bench import run_bench

    sizes = _int_list(batch_sizes)
    with runtime_py.load(bundle_path, backend=backend, intra_op_threads=threads) as model:
        too_big = [b for b in sizes if b > model.max_batch_size]
        if too_big:
            raise UsageError(f"batch sizes {too_big} exceed the bundle's max batch "
                             f"{model.max_batch_size}")
        report = run_bench(model, sizes, concurrency, end_to_end=not no_end_to_end,
                           min_seconds=min_seconds,
                           progress=lambda message: print_progress("bench", message))
    if as_json:
        echo_json(report)
        return
    click.echo(f"{report['bundle']} ({report['backend']}) {report['id'][:16]}")
    click.echo(f"{'boundary':<11} {'batch':>5} {'median ms':>10} {'p90 ms':>9} {'items/s':>9}  note")
    for f in report["figures"]:
        click.echo(f"{f['boundary']:<11} {f['batch_size']:>5} {f['median_ms']:>10.2f} "
                   f"{f['p90_ms']:>9.2f} {f['items_per_s']:>9.1f}  {f['note']}")
    for note in report["notes"]:
        click.echo(note)


# --- eval / study ----------------------------------------------------------------------------

def _format_quality(q: dict) -> str:
    text = (f"top-1 agreement {q['top1_agreement']:.4f}, KL mean {q['kl_mean']:.3g}, "
            f"max |diff| {q['max_abs_diff']:.3g}, NaN {q['nan_count']}, Inf {q['inf_count']}")
    if "top1_accuracy" in q:
        text += (f"; top-1 accuracy {q['top1_accuracy']:.4f} "
                 f"(fp32 {q['reference_top1_accuracy']:.4f})")
    return text


#: `bundle eval --data` and `bundle study --eval-data`: one option, one rule (bundler.class_labels).
labels_from_option = click.option(
    "--labels-from", default="auto", show_default=True, type=click.Choice(CLASS_FOLDER_RULES),
    help="Labels of per-class folders of the data. auto/synsets: folders named by the "
         "family's class ids (ImageNet synsets, e.g. n01440764) map to their classes, other "
         "names are refused; folder-index: names are class indices; folder-order: sorted "
         "folder order (torchvision ImageFolder); none: no labels.")


@cli.command("eval", context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("bundle_path", metavar="BUNDLE", type=click.Path(path_type=str))
@click.option("--data", required=True, type=click.Path(path_type=str),
              help="Images: a folder (a folder per class gives labels), webdataset .tar "
                   "shards (.cls labels) or a .safetensors of preprocessed tensors.")
@click.option("--count", type=int, default=None, help="Images to evaluate on [default: 500].")
@click.option("--stride", default=1, show_default=True, help="Take every n-th image.")
@click.option("--reference", type=click.Path(path_type=str), default=None,
              help="fp32 bundle of the same family and weights to compare with (default: "
                   "rebuild the fp32 graph from the bundle's recorded weights).")
@click.option("--checkpoint", type=click.Path(path_type=str), default=None,
              help="Without --reference: the .safetensors checkpoint the bundle was made from "
                   "(default: the Hugging Face cache).")
@click.option("--backend", default="auto", show_default=True, type=backend_choice(auto=True),
              help="Engine to run the bundle on (auto: its own target when this host can).")
@click.option("--allow-calibration-images", is_flag=True,
              help="Evaluate even on images the bundle was calibrated on (flattering figures).")
@labels_from_option
@click.option("--batch-size", default=8, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@handle_errors
def eval_(bundle_path, data, count, stride, reference, checkpoint, backend,
          allow_calibration_images, labels_from, batch_size, as_json) -> None:
    """Quality of a bundle against the family's fp32 reference, on data and stress inputs.

    Top-1 against labels (when the data has them), top-1 agreement, mean KL, max |logit
    difference| and NaN/Inf counts. Refuses images used for calibration unless
    --allow-calibration-images. Progress goes to stderr (also with --json).
    """
    from runtime_py.extras import require_extra

    require_extra("export", "`bundle eval` (it runs the family's fp32 reference)")
    from bundler.evaluate import evaluate_bundle

    report = evaluate_bundle(bundle_path, data, reference=reference, count=count, stride=stride,
                             backend=backend, allow_calibration_overlap=allow_calibration_images,
                             batch_size=batch_size, checkpoint=checkpoint,
                             labels_from=labels_from, progress=print_progress)
    if as_json:
        from bundler.study_report import _jsonable

        echo_json(_jsonable(report))
        return
    ref, d = report["reference"], report["data"]
    click.echo(f"{report['bundle']} ({report['engine']['backend']}) {report['id'][:16]}"
               + ("  RANDOM WEIGHTS" if report["random_weights"] else ""))
    click.echo(f"reference  {ref['kind']} {ref.get('name', '')}".rstrip())
    click.echo(f"data       {d['images']} images from {d['source']}"
               + (" (labelled)" if d["labelled"] else ""))
    click.echo(f"calibration overlap: {report['calibration_overlap']['overlap']} "
               f"({report['calibration_overlap']['checked']})")
    click.echo(f"quality    {_format_quality(report['quality'])}")
    totals = report["stress"]["totals"]
    click.echo(f"stress     {totals['images']} inputs: {_format_quality(totals)}; non-finite on: "
               f"{', '.join(totals['nonfinite_inputs']) or 'none'}")


def _str_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


@cli.command(context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("family")
@click.option("--precisions", default="fp16,fp8", show_default=True,
              help="Comma-separated; fp32 is always built as the reference.")
@click.option("--variants", default="", help="Comma-separated recipe variants, e.g. fp8-depthwise.")
@click.option("--batch-sizes", default="1,32", show_default=True, help="Comma-separated.")
@click.option("--backend", default="onnxruntime", show_default=True,
              type=backend_choice(auto=True),
              help="Engine target of the bundles.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the bundles, study.json, study.md and study.png.")
@click.option("--random-weights", is_flag=True, help="Seeded random weights (smoke study).")
@click.option("--seed", default=0, show_default=True)
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None)
@click.option("--calib-data", type=click.Path(path_type=Path), default=None)
@click.option("--calib-count", type=int, default=None,
              help="[default: 16 with --random-weights, else 500]")
@click.option("--eval-data", type=click.Path(path_type=Path), default=None,
              help="Held-out images to evaluate on (default: --eval-count seeded synthetic "
                   "pictures, apart from calibration's and the reference inputs).")
@click.option("--eval-count", type=int, default=None,
              help="[default: 32 with --random-weights, else 500]")
@click.option("--eval-stride", default=1, show_default=True)
@labels_from_option
@click.option("--allow-calibration-images", is_flag=True)
@click.option("--no-reuse", is_flag=True, help="Rebuild bundles even when the same ones exist.")
@click.option("--peer", type=click.Choice(PEERS), default=None,
              help="Also measure what a user would run instead, in the same run: on a GPU the "
                   "timm model in fp16, channels_last, torch.compile (default mode), CUDA graph "
                   "replay, same boundaries; without one the fp32 eager model.")
@input_dtype_option("What every bundle takes (`bundle make --input`), the fp32 reference "
                    "included; with uint8 the peer takes the same pixels and normalizes them "
                    "on the GPU, and with_copies copies 4x fewer bytes.")
@click.option("--json", "as_json", is_flag=True, help="Print study.json to stdout.")
@handle_errors
def study(family, precisions, variants, batch_sizes, backend, out_dir, random_weights, seed,
          checkpoint, calib_data, calib_count, eval_data, eval_count, eval_stride, labels_from,
          allow_calibration_images, no_reuse, peer, input_dtype, as_json) -> None:
    """Build (or reuse) FAMILY's bundles and measure speed, size and quality side by side:

    \b
      bundle study timm_xception --random-weights --out study-cpu/
      bundle study timm_xception --backend tensorrt --variants fp8-depthwise \\
          --calib-data calib/ --eval-data val/ --out study-trt/
      bundle study timm_xception --backend torch-aoti --peer torch-compile \\
          --input uint8 --random-weights --out study-gpu/

    Writes study.json, study.md and study.png (with matplotlib) into --out.
    """
    import shlex

    from runtime_py.extras import require_extra

    require_extra("export", "`bundle study`")
    from bundler.study import run_study

    result = run_study(
        family, precisions=_str_list(precisions), variants=_str_list(variants),
        batch_sizes=_int_list(batch_sizes), out_dir=out_dir, backend=backend,
        random_weights=random_weights, seed=seed, checkpoint=checkpoint, calib_data=calib_data,
        calib_count=calib_count, eval_data=eval_data, eval_count=eval_count,
        eval_stride=eval_stride, labels_from=labels_from,
        allow_calibration_overlap=allow_calibration_images, reuse=not no_reuse,
        command=shlex.join(["bundle"] + sys.argv[1:]), progress=print_progress, peer=peer,
        input_dtype=input_dtype)
    if as_json:
        from bundler.study_report import _jsonable

        echo_json(_jsonable(result))
        return
    for r in result["ratios"]:
        click.echo(f"batch {r['batch_size']:>3} {r['boundary']:<12} {r['numerator']}/"
                   f"{r['denominator']} time ratio {r['ratio']:.3f}x")
    for r in result.get("peer_ratios", []):
        click.echo(f"batch {r['batch_size']:>3} {r['boundary']:<12} peer/{r['bundle']} time "
                   f"ratio {r['ratio']:.3f}x")
    files = result["files"]
    if "plot_skipped" in files:
        click.echo(f"plot skipped: {files['plot_skipped']}")
    click.echo(f"wrote {', '.join(files[k] for k in ('md', 'json', 'png') if k in files)}")


# --- export (deployment files for other serving engines) ----------------------------------

@cli.group("export", context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
def export_group() -> None:
    """Write the files another serving engine needs to serve bundles (docs/deploy.md).

    \b
    bundle export triton BUNDLE... --repo DIR        a Triton model repository
    bundle export kserve BUNDLE --storage-uri URI    KServe InferenceService + ServingRuntime
    Nothing is half-written: a failure leaves the output as it was.
    """


@export_group.command("triton", context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("bundle_paths", metavar="BUNDLE...", nargs=-1, required=True,
                type=click.Path(path_type=str))
@click.option("--repo", "repo", required=True, type=click.Path(path_type=Path),
              help="The model repository folder (created if missing).")
@click.option("--max-delay-ms", default=2.0, show_default=True,
              help="Dynamic batching queue delay (the manifest records none; this is "
                   "`bundle serve`'s default).")
@click.option("--instances", default=1, show_default=True, help="Instances per model.")
@click.option("--device", default="auto", show_default=True,
              type=click.Choice(["auto", "cpu", "gpu"]),
              help="Instance kind of ONNX Runtime models (plans and AOTInductor packages "
                   "run on the GPU they were built for).")
@click.option("--tensorrt-version", default=None,
              help="TensorRT version of the Triton server (needed for TensorRT bundles: the "
                   "plan's compatibility record is checked against it).")
@click.option("--compute-capability", default=None,
              help="Compute capability of the Triton server's GPU, e.g. 9.0 (TensorRT "
                   "bundles).")
@click.option("--runtime-backend", default=None,
              type=backend_choice(auto=True),
              help="python-backend models (torch-aoti bundles): the engine runtime_py runs "
                   "(default: the bundle's own, never a silent fallback).")
@click.option("--no-ensemble", is_flag=True,
              help="Do not add the preprocessing model and the image-in ensemble.")
@click.option("--overwrite", is_flag=True, help="Replace models of the same name.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@handle_errors
def export_triton_cmd(bundle_paths, repo, max_delay_ms, instances, device, tensorrt_version,
                      compute_capability, runtime_backend, no_ensemble, overwrite,
                      as_json) -> None:
    """Write BUNDLEs into a Triton model repository.

    \b
    onnxruntime bundle  <name>/1/model.onnx on the onnxruntime backend
    tensorrt bundle     <name>/1/model.plan on the tensorrt backend (compatibility checked)
    torch-aoti bundle   <name>/1/model.py on the python backend, loading the bundle
    with a preprocessing spec, also <name>-preprocess (python backend, encoded images in)
    and <name>-ensemble (images in, the bundle's outputs out).
    Each config.pbtxt is parsed with Triton's model_config.proto where tritonclient is
    installed.
    """
    from bundler.deploy.triton import TritonOptions, export_triton

    options = TritonOptions(max_delay_ms=max_delay_ms, instances=instances, device=device,
                            tensorrt_version=tensorrt_version,
                            compute_capability=compute_capability,
                            runtime_backend=runtime_backend, ensemble=not no_ensemble,
                            overwrite=overwrite)
    models, checked = export_triton(bundle_paths, repo, options)
    if as_json:
        echo_json({"repo": str(repo), "checked_with_triton_schema": checked,
                   "models": [{"name": m.name, "backend": m.backend, "bundle_id": m.bundle_id,
                               "path": str(m.path), "files": m.files} for m in models]})
        return
    for m in models:
        click.echo(f"{m.name:<40} {m.backend:<12} {m.path}")
    if len(checked) == len(models):
        click.echo("every config.pbtxt parsed with Triton's model_config.proto", err=True)
    else:
        click.echo("config.pbtxt not checked against Triton's schema: pip install "
                   "'tritonclient[grpc]' to check", err=True)


@export_group.command("kserve", context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.argument("bundle_path", metavar="BUNDLE", type=click.Path(path_type=str))
@click.option("--storage-uri", required=True,
              help="Where KServe fetches the bundle from (s3://, gs://, pvc://, https://...).")
@click.option("--out", "out_dir", default=".", show_default=True,
              type=click.Path(path_type=Path), help="Folder for the two YAML files.")
@click.option("--name", default=None,
              help="InferenceService name (default: the served model name as a DNS label).")
@click.option("--namespace", default=None)
@click.option("--image", default="trt-bundle-serve:0.1.0", show_default=True,
              help="The serving image (docker/Dockerfile).")
@click.option("--gpus", type=int, default=None,
              help="nvidia.com/gpu per replica (default: 1 where the engine runs on a GPU "
                   "only: TensorRT plans, CUDA AOTInductor packages; else 0).")
@click.option("--cpu", default="1", show_default=True, help="CPU request and limit.")
@click.option("--memory", default="2Gi", show_default=True, help="Memory request and limit.")
@click.option("--min-replicas", type=int, default=None)
@click.option("--max-replicas", type=int, default=None)
@click.option("--max-batch", type=int, default=None, help="`bundle serve --max-batch`.")
@click.option("--max-delay-ms", default=2.0, show_default=True,
              help="`bundle serve --max-delay-ms`.")
@click.option("--backend", default="auto", show_default=True,
              type=backend_choice(auto=True),
              help="`bundle serve --backend`.")
@click.option("--overwrite", is_flag=True, help="Replace existing files of the same names.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@handle_errors
def export_kserve_cmd(bundle_path, storage_uri, out_dir, name, namespace, image, gpus, cpu,
                      memory, min_replicas, max_replicas, max_batch, max_delay_ms, backend,
                      overwrite, as_json) -> None:
    """Write a KServe ServingRuntime and InferenceService (v2 protocol) for BUNDLE.

    The container fetches the bundle from --storage-uri (KServe's storage initializer),
    verifies it and checks its id against the one pinned in the manifest, then runs
    `bundle serve`. Probes: startup and liveness on /v2/health/live, readiness on
    /v2/health/ready. Apply with `kubectl apply -f OUT/`.
    """
    from bundler.deploy.kserve import KServeOptions, export_kserve

    options = KServeOptions(storage_uri=storage_uri, name=name, namespace=namespace,
                            image=image, gpus=gpus, cpu=cpu, memory=memory,
                            max_batch=max_batch, max_delay_ms=max_delay_ms, backend=backend,
                            min_replicas=min_replicas, max_replicas=max_replicas,
                            overwrite=overwrite)
    result = export_kserve(bundle_path, out_dir, options)
    if as_json:
        echo_json({"files": [str(f) for f in result.files], "bundle_id": result.bundle_id,
                   "name": result.name, "served_model_name": result.served_model_name,
                   "checked_with_kserve_sdk": result.checked_with_sdk})
        return
    for f in result.files:
        click.echo(f)
    click.echo(f"model {result.served_model_name}: POST /v2/models/{result.served_model_name}"
               "/infer", err=True)
    if not result.checked_with_sdk:
        click.echo("manifests not checked against the KServe SDK's models: pip install "
                   "kserve to check", err=True)


def main() -> None:
    cli(prog_name="bundle")


if __name__ == "__main__":
    main()
