"""``python -m opdump run [options] -- command ...``: runs any command with
the plugin preloaded and dumping on, its options mapped to ``OPDUMP_*``
variables. ``python -m opdump compare|summary ...`` runs the ``opdump``
tool."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ._cli import cli_path
from ._native import library_path, supported_torch_versions

# Options that take a value: (option, variable, help).
_VALUED = (
    ("--dir", "OPDUMP_DIR", "where the dump goes (default ./opdump)"),
    ("--include", "OPDUMP_INCLUDE", "regex searched in op.overload; only matching ops are recorded"),
    ("--exclude", "OPDUMP_EXCLUDE", "regex searched in op.overload; matching ops are not recorded"),
    ("--steps", "OPDUMP_STEPS", "steps to record: 0-2,10"),
    ("--ranks", "OPDUMP_RANKS", "ranks that record: 0,3"),
    ("--max-depth", "OPDUMP_MAX_DEPTH", "deepest nesting level recorded; 0: top-level ops only"),
    ("--max-records", "OPDUMP_MAX_RECORDS", "stop after this many op calls per process"),
    ("--fork", "OPDUMP_FORK", "forked children (DataLoader workers): off or record"),
)
# Switches: (option, variable, the value it sets, help).
_SWITCHES = (
    ("--outputs-only", "OPDUMP_INPUTS", "0", "record outputs only"),
    ("--no-reuse", "OPDUMP_REUSE", "0", "measure every tensor, no reuse or view shortcuts"),
    ("--no-modules", "OPDUMP_MODULES", "0", "install no module hooks (no module, name, fwd_seq)"),
    ("--source", "OPDUMP_SOURCE", "1", "name the line of user code of top-level calls"),
    ("--off", "OPDUMP", "0", "load the plugin but leave dumping off (torch.ops.opdump.enable() starts it)"),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m opdump run",
        description="Run a command with opdump preloaded (LD_PRELOAD) and dumping on (OPDUMP=1). "
                    "The command needs no change: every process of it that loads torch is recorded.",
        epilog="Example: python -m opdump run --dir dump-cpu --steps 0-1 -- python train.py --device cpu. "
               "Every option sets the OPDUMP_* variable named in its help; README.md lists them all.")
    for flag, var, what in _VALUED:
        p.add_argument(flag, metavar="VALUE", help=f"{what} [{var}]")
    for flag, var, value, what in _SWITCHES:
        p.add_argument(flag, action="store_true", help=f"{what} [{var}={value}]")
    p.add_argument("--set", action="append", default=[], metavar="OPDUMP_NAME=VALUE",
                   help="set any other OPDUMP_* variable; may be repeated")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    return p


def environment(args: argparse.Namespace, base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ``base`` with the plugin preloaded and the
    options' variables set."""
    env = dict(os.environ if base is None else base)
    lib = library_path()
    if lib is None:
        raise SystemExit("opdump: this opdump package carries no libopdump.so; reinstall the wheel")
    preload = [p for p in env.get("LD_PRELOAD", "").split() if p and not p.endswith("/libopdump.so")]
    env["LD_PRELOAD"] = " ".join([str(lib), *preload])
    env["OPDUMP"] = "1"
    for flag, var, _ in _VALUED:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            env[var] = value
    for flag, var, value, _ in _SWITCHES:
        if getattr(args, flag[2:].replace("-", "_")):
            env[var] = value
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("OPDUMP"):
            raise SystemExit(f"opdump: --set {item!r}: expected OPDUMP_NAME=VALUE, e.g. --set OPDUMP_QUEUE=65536")
        env[name] = value
    return env


def run(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _parser().error("no command given: python -m opdump run [options] -- python train.py ...")
    env = environment(args)
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        print(f"opdump: cannot run {command[0]!r}: {e}; "
              "check the command after -- (its name, PATH, execute permission)", file=sys.stderr)
        return 127


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: python -m opdump run [options] -- command ...   (run a job with dumping on)\n"
             "       python -m opdump compare A B [options]          (the opdump tool)\n"
             "       python -m opdump summary DUMP [options]\n"
             "       python -m opdump info                          (what this package carries)")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] == "run":
        return run(argv[1:])
    if argv[0] == "info":
        print(f"library: {library_path()}")
        print(f"cores for torch: {', '.join(supported_torch_versions()) or '(a build: the torch it was built for)'}")
        print(f"command: {cli_path()}")
        return 0
    cli = cli_path()
    if cli is None:
        print("opdump: the opdump command is not installed: reinstall the opdump wheel", file=sys.stderr)
        return 2
    os.execv(str(cli), [str(cli), *argv])
