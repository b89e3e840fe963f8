"""What both command lines share: one argument policy for every subcommand, and one ``main``
that turns every expected failure into one line on stderr and exit status 2.

The policy is applied to the finished parser, so it covers commands registered by any module:
  * every ``type=float`` option must be finite (``nan`` and ``inf`` are refused);
  * every ``type=int`` option must fit in 62 bits (a 30-digit count is a typo, not a request);
  * counts named in ``MIN_BY_DEST`` have a floor (seeds >= 0, workers >= 1, ``--top`` >= 1);
  * output options named in ``OUTPUT_FILES`` / ``OUTPUT_DIRS`` are checked for writability while
    the arguments are parsed, i.e. before any long computation starts.
Exit statuses: 0 success, 2 bad input (one line), 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .caches import CacheWarning
from .errors import UserError
from .fileio import check_output_dir, check_output_file
from .jsonio import dumps_strict

INT_LIMIT = 2 ** 62
MIN_BY_DEST = {"seed": 0, "workers": 1, "top": 1, "emulate_top": 1, "trace_capacity": 1,
               "trace_max_events": 1, "max_cycles": 1}
OUTPUT_FILES = {"trace", "plot", "roofline"}
OUTPUT_DIRS = {"out", "out_dir"}


# help of the flags many commands share, given where a command's own definition has none (one text
# per flag, so the commands that share it say the same); ``(command, flag)`` wins over ``flag``
SHARED_HELP = {
    "--json": "print the result as JSON on stdout (nothing else; errors still one line on stderr)",
    "--m": "GEMM rows (M)", "--k": "GEMM inner dimension (K)", "--n": "GEMM columns (N)",
    "--mode": "timing: cycles only, no data; functional: also computes the results",
    "--mg": "tile: rows per m-block, over all DSPs (mg)", "--k2": "tile: rows of a B tile (k2)",
    "--n2": "tile: columns of a B tile (n2)", "--mr": "tile: micro-kernel rows (mr)",
    "--nv": "tile: micro-kernel vectors per row (nv)", "--rotation": "tile: register sets operands rotate through",
    "--seq": "sequence length", "--heads": "query heads", "--head-dim": "head dimension",
    "--br": "tile: query rows per tile (Br)", "--bc": "tile: keys per tile (Bc)",
    "--br-prime": "tile: query rows per backward sub-tile (Br')",
    "--bc-prime": "tile: keys per backward sub-tile (Bc')",
    "--variant": "resident (Algorithm 1, intermediates on chip) or ddr-staged (the baseline)",
    "--model": "a built-in model name or a GPT name (see `ratrain model --help`)",
    "--hf-config": "a HuggingFace config.json instead of --model",
    "--micro-batch": "sequences per micro-batch (b)", "--tp": "tensor-parallel degree (T)",
    "--activation": "activation memory policy: fsr (recover in the backward), ckpt (recompute), full (keep all)",
    "--prefetch": "state prefetch and update: layerwise (per layer, overlapped) or bulk (at the step's end)",
    "--partition": "how layers are split over stages: balanced (by their cost) or uniform (equal layer counts)",
    ("tune", "--k2"): "comma-separated k2 values to try", ("tune", "--n2"): "comma-separated n2 values to try",
    ("tune", "--top"): "candidates listed in the ranking (default 5)",
}


def _fill_help(parser: argparse.ArgumentParser) -> None:
    command = parser.prog.split()[-1]
    for action in parser._actions:
        if action.option_strings and action.help is None:
            flag = action.option_strings[-1]
            action.help = SHARED_HELP.get((command, flag), SHARED_HELP.get(flag))


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage text is one ``--help`` away)."""

    def error(self, message: str) -> None:    # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _flag(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def finite_float(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        return value
    parse.__name__ = "float"
    return parse


def bounded_int(flag: str, low: int = -INT_LIMIT, high: int = INT_LIMIT) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if len(text.strip()) > 30:
            raise argparse.ArgumentTypeError(f"integer of {len(text.strip())} characters is out of range")
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value
    parse.__name__ = "int"
    return parse


def _output(kind: str, flag: str) -> Callable[[str], str]:
    check = check_output_dir if kind == "dir" else check_output_file

    def parse(text: str) -> str:
        if text == ".":
            return text       # the working folder (`mtemu run`'s default): checked when written
        try:
            check(text, "")      # argparse names the flag itself
        except UserError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    parse.__name__ = "path"
    return parse


def apply_policy(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Apply the module's argument policy to ``parser`` and every subcommand parser under it."""
    _fill_help(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_policy(sub)
            continue
        if action.type is float:
            action.type = finite_float(_flag(action))
        elif action.type is int:
            action.type = bounded_int(_flag(action), MIN_BY_DEST.get(action.dest, -INT_LIMIT))
        elif action.type is None and action.option_strings and action.nargs is None \
                and not isinstance(action.const, bool):
            if action.dest in OUTPUT_FILES:
                action.type = _output("file", _flag(action))
            elif action.dest in OUTPUT_DIRS:
                action.type = _output("dir", _flag(action))
    return parser


def _os_message(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else ""
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}" if where else reason


def run_main(prog: str, parser: argparse.ArgumentParser, argv: list[str] | None,
             expected: tuple[type[BaseException], ...] = (UserError,)) -> int:
    """Parse, run the handler, print its payload (strict JSON with ``--json``) or text.

    Expected failures (``expected``, OS errors on inputs and outputs, running out of memory)
    print one line ``PROG CMD: error: ...`` and return 2; Ctrl-C prints ``PROG CMD: interrupted``
    and returns 130."""
    try:
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:       # a usage error (one line, status 2) or --help (status 0)
        return exc.code if isinstance(exc.code, int) else 2
    name = f"{prog} {getattr(args, 'command', '')}".strip()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_cache_warnings(name, warnings.showwarning)
            result = args.handler(args)
        if result is None:
            return 0
        payload, text = result
        out = dumps_strict(payload) if getattr(args, "json", False) else text
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except expected as exc:
        return _fail(name, str(exc))
    except OSError as exc:
        return _fail(name, _os_message(exc))
    except MemoryError as exc:
        return _fail(name, f"out of host memory{f' ({exc})' if str(exc) else ''}; try a smaller problem")
    if sys.stdout is None:          # started with stdout closed (`cmd >&-`): Python leaves None there
        return _fail(name, "cannot write the output: standard output is closed")
    try:
        print(out)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: not an error of ours
        sys.stdout = None
    except OSError as exc:      # e.g. stdout redirected to a full disk
        return _fail(name, f"cannot write the output: {_os_message(exc)}")
    return 0


def _one_line_cache_warnings(name: str, show: Callable) -> Callable:
    """A cache warning as one line ``PROG CMD: warning: ...`` (it names its file); others as before."""
    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CacheWarning):
            print(f"{name}: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
        else:
            show(message, category, filename, lineno, file, line)
    return showwarning


def _fail(name: str, message: str) -> int:
    line = " ".join(message.split())       # one line, whatever the message held
    print(f"{name}: error: {line}", file=sys.stderr)
    return 2


def new_parser(prog: str, description: str, **kwargs: Any) -> OneLineParser:
    return OneLineParser(prog=prog, description=description, **kwargs)


@dataclass(frozen=True)
class Command:
    """One subcommand of a command line: its name, the module whose ``register(subparsers)`` adds it,
    and its one-line help (the same text the module passes to ``add_parser``)."""

    name: str
    module: str
    help: str


def chosen_command(commands: Sequence[Command], argv: Sequence[str]) -> Command | None:
    """The command ``argv`` runs: its first word that is not an option (the top level takes no
    option but ``-h``), or None (``--help``, no command, or an unknown one)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return next((c for c in commands if c.name == word), None)


def add_commands(sub: argparse._SubParsersAction, commands: Sequence[Command],
                 argv: Sequence[str] | None) -> None:
    """Add ``commands`` to ``sub`` in order, lazily: only the module of the command ``argv`` runs is
    imported and registers its commands in full; every other command is its name and help line, all
    the top-level ``--help`` prints. So a command loads what it runs and nothing the others need.
    ``argv=None`` registers every command in full (the whole tree, for tests and docs)."""
    chosen = None if argv is None else chosen_command(commands, argv)
    registered: set[str] = set()
    for command in commands:
        if command.name in registered:
            continue
        if argv is None or (chosen is not None and command.module == chosen.module):
            before = set(sub.choices)
            importlib.import_module(command.module).register(sub)
            registered |= set(sub.choices) - before
        else:
            sub.add_parser(command.name, help=command.help)
            registered.add(command.name)


def command_parser(prog: str, description: str, commands: Sequence[Command],
                   argv: Sequence[str] | None) -> OneLineParser:
    """A command line's parser for ``argv`` (see ``add_commands``), the argument policy applied."""
    parser = new_parser(prog, description)
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub, commands, argv)
    return apply_policy(parser)
