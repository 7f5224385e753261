"""The function-check protocol of `sgrpo_sandbox.run_check`: the dataset's test and the model's function never share a
process, so nothing the function does can change the verdict except the values it returns.

Two processes, started by the sandbox's bootstrap (boot.py), each with a uid of its own:

- the candidate (untrusted: the completion) runs the program that defines the function, then `serve`s calls: it
  decodes each call's arguments (fresh copies), calls its function, and sends back the value and the new contents
  of every argument container the call changed;
- the checker (trusted: the dataset's test) runs `run_checker`: the problem's setup (HumanEval's prompt, whose helper
  functions the tests use) and test, then `check(candidate)` with a stand-in (`StandIn`) for the function whose
  calls go to the candidate; it puts the changed contents into the test's own objects, in place, so a call that
  mutates its arguments acts as it would in-process. It alone writes the verdict, to a pipe the candidate does not
  hold.

Messages are single lines of JSON (`Channel`, `dumps`, `loads`), at most MAX_MESSAGE bytes. Values travel as JSON
trees (`Encoder`: tagged objects for what JSON lacks, containers numbered by identity) and are rebuilt on the trusted
side only by the strict `Decoder`, from plain types and nothing else: no object of the candidate's classes ever
reaches the checker, so `==`, `abs()`, `math.isclose` there are Python's own. Whatever the candidate sends that is
not a well-formed answer (garbage, a value that cannot be encoded, an exception, silence, an exit) fails the check,
even where the test would have caught an exception from an in-process candidate (no HumanEval test expects one).

Standard library only, and cheap to import (the bootstrap imports it at every program start: the C JSON scanner and
encoder, not the `json` package, whose import compiles regular expressions); nothing here runs source code: the
bootstrap passes in the one function that does.
"""

from __future__ import annotations

import _json
import os
import sys

MAX_MESSAGE = 4 << 20  # bytes in one message (a HumanEval call or answer is well under 1 KiB)
_BIG = 1 << 63  # ints at least this large travel as hex (JSON's decimal digits are capped by int_max_str_digits)
_HEX_DIGITS = frozenset("0123456789abcdef")
_INF = float("inf")


class ProtocolError(Exception):
    """A message that the protocol does not allow, or a channel that was closed."""


# ----------------------------------------------------------------------------------------------------- values

_KINDS = ((list, "list"), (dict, "dict"), (set, "set"), (bytearray, "bytearray"))  # mutable: numbered, by identity


def _kind(value) -> str | None:
    return next((name for cls, name in _KINDS if isinstance(value, cls)), None)


class Encoder:
    """Values -> JSON trees. Immutable values: JSON's own, or a tagged object ({"tuple": [...]}, {"frozenset": ...},
    {"bytes": hex}, {"complex": [re, im]}, {"range": [start, stop, step]}, {"int": hex} beyond 64 bits, {"iter":
    [...]} for an iterator's items). Mutable containers are numbered by identity: the first occurrence is {"list":
    [n, items]} (or "dict" with [key, value] pairs, "set", "bytearray"), every later one {"ref": n}, so aliases,
    cycles and the test's own objects keep their identity across the trip. Subclasses of these types travel as the
    type itself (a Counter as a dict, a namedtuple as a tuple: equal to what they equal in-process). ValueError for
    anything else (a function, an instance of the candidate's class)."""

    def __init__(self, known: dict | None = None):
        self.objects = dict(known or {})  # number -> container; kept alive, so ids are not reused meanwhile
        self.numbers = {id(obj): n for n, obj in self.objects.items()}
        self.next = max(self.objects, default=-1) + 1

    def value(self, value, depth: int = 0):
        if depth > 200:
            raise ValueError("nested too deeply")
        if value is None or isinstance(value, bool):
            return value if value is None else bool(value)
        if isinstance(value, int):
            value = int(value)
            return value if -_BIG < value < _BIG else {"int": format(value, "x")}
        if isinstance(value, float | str):
            return float(value) if isinstance(value, float) else str(value)
        kind, depth = _kind(value), depth + 1
        if kind is not None:
            if id(value) in self.numbers:
                return {"ref": self.numbers[id(value)]}
            n = self.numbers[id(value)] = self.next
            self.objects[n], self.next = value, n + 1
            return {kind: [n, self.contents(value, depth)]}
        if isinstance(value, tuple | frozenset):
            return {"tuple" if isinstance(value, tuple) else "frozenset": [self.value(x, depth) for x in value]}
        if isinstance(value, bytes):
            return {"bytes": value.hex()}
        if isinstance(value, complex):
            return {"complex": [value.real, value.imag]}
        if isinstance(value, range):
            return {"range": [value.start, value.stop, value.step]}
        if hasattr(type(value), "__next__") and hasattr(type(value), "__iter__"):
            return {"iter": [self.value(x, depth) for x in value]}
        raise ValueError(f"a value of type {type(value).__name__} cannot be sent")

    def contents(self, container, depth: int = 0):
        """What the mutable `container` holds now, as a tree (its own number is not in it)."""
        if isinstance(container, dict):
            return [[self.value(k, depth), self.value(v, depth)] for k, v in container.items()]
        if isinstance(container, bytearray):
            return bytes(container).hex()
        return [self.value(x, depth) for x in container]


class Decoder:
    """JSON trees -> values, built from plain types only; ValueError (or TypeError, RecursionError) for anything
    that `Encoder` would not have made. `known`: number -> container, the objects that {"ref": n} may name besides
    those defined in the trees decoded here. On the trusted side, the candidate's answers go through this."""

    def __init__(self, known: dict | None = None):
        self.objects = dict(known or {})

    def value(self, tree):
        if tree is None or isinstance(tree, bool | int | float | str):
            return tree
        if not isinstance(tree, dict) or len(tree) != 1:
            raise ValueError("not an encoded value")
        ((tag, body),) = tree.items()
        if tag == "ref":
            if type(body) is not int or body not in self.objects:
                raise ValueError("a reference to nothing")
            return self.objects[body]
        if tag in ("list", "dict", "set", "bytearray"):
            if not (isinstance(body, list) and len(body) == 2 and type(body[0]) is int and body[0] not in self.objects):
                raise ValueError(f"tag {_clip(tag)}: expected [a new number, contents]")
            container = self.objects[body[0]] = {"list": list, "dict": dict, "set": set, "bytearray": bytearray}[tag]()
            _replace(container, self.contents(container, body[1]))
            return container
        if tag in ("tuple", "frozenset", "iter"):
            if not isinstance(body, list):
                raise ValueError(f"tag {_clip(tag)}: expected a list")
            items = [self.value(x) for x in body]
            return (
                tuple(items) if tag == "tuple" else iter(items) if tag == "iter" else frozenset(map(_hashable, items))
            )
        if tag == "bytes" and isinstance(body, str):
            return bytes.fromhex(body)
        if tag == "int" and isinstance(body, str) and _is_hex(body.removeprefix("-")):
            return int(body, 16)
        if tag == "complex" and len(nums := _floats(body)) == 2:
            return complex(*nums)
        if tag == "range" and isinstance(body, list) and len(body) == 3 and all(type(x) is int for x in body):
            return range(*body)
        raise ValueError(f"not an encoded value (tag {_clip(tag)})")

    def contents(self, container, tree):
        """New contents for `container` (a list, dict, set or bytearray) from `tree`, not yet put in it."""
        kind = _kind(container)
        if kind == "bytearray":
            if not isinstance(tree, str):
                raise ValueError("bytearray contents: expected hex")
            return bytes.fromhex(tree)
        if not isinstance(tree, list):
            raise ValueError(f"{kind} contents: expected a list")
        if kind == "dict":
            if not all(isinstance(p, list) and len(p) == 2 for p in tree):
                raise ValueError("dict contents: expected [key, value] pairs")
            return [(_hashable(self.value(k)), self.value(v)) for k, v in tree]
        items = [self.value(x) for x in tree]
        return [_hashable(x) for x in items] if kind == "set" else items


def _replace(container, contents) -> None:
    """Put `contents` (from Decoder.contents) in `container`, in place: what references to it see."""
    if isinstance(container, dict):
        container.clear()
        container.update(contents)
    elif isinstance(container, set):
        container.clear()
        container.update(contents)
    else:
        container[:] = contents


def encode(value):
    """`value` as a JSON tree, on its own (`Encoder`)."""
    return Encoder().value(value)


def decode(tree):
    """The value of a JSON tree made by `encode`, on its own (`Decoder`)."""
    return Decoder().value(tree)


def _is_hex(digits: str) -> bool:
    return 0 < len(digits) and set(digits) <= _HEX_DIGITS  # what int(x, 16) would also accept: no sign, "0x", "_"


def _hashable(value):
    hash(value)  # TypeError for a list as a key or set element: not a well-formed answer
    return value


def _floats(body) -> list[float]:
    if not isinstance(body, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in body):
        raise ValueError("expected numbers")
    try:
        return [float(x) for x in body]
    except OverflowError:  # an int beyond the largest float
        raise ValueError("a number too large for a float") from None


def _clip(text: str, most: int = 40) -> str:  # a candidate's str in a message: its length is not the candidate's
    return repr(text[:most]) + ("..." if len(text) > most else "")


class _ScannerContext:
    """What the C JSON scanner reads from a decoder: strict JSON plus NaN and +-Infinity, plain types only."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"NaN": float("nan"), "Infinity": _INF, "-Infinity": -_INF}.__getitem__
    memo: dict = {}


_scan = _json.make_scanner(_ScannerContext())


def loads(text: str):
    """The JSON value that is all of `text`; ValueError when it is not one (RecursionError: nested too deeply)."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("not JSON: text after the value")
    return value


def dumps(tree) -> str:
    """Compact JSON of `tree` (None, bool, int, float, str, lists and str-keyed dicts of them), in ASCII: no
    newline in it."""
    kind = type(tree)
    if tree is None or kind is bool:
        return "null" if tree is None else "true" if tree else "false"
    if kind is int:
        return int.__repr__(tree)
    if kind is float:
        if tree != tree:
            return "NaN"
        return float.__repr__(tree) if tree - tree == 0 else "Infinity" if tree > 0 else "-Infinity"
    if kind is str:
        return _json.encode_basestring_ascii(tree)
    if kind is list:
        return "[" + ",".join([dumps(x) for x in tree]) + "]"
    if kind is dict:
        return "{" + ",".join([_json.encode_basestring_ascii(k) + ":" + dumps(v) for k, v in tree.items()]) + "}"
    raise ValueError(f"not JSON data: {kind.__name__}")


# ----------------------------------------------------------------------------------------------------- the channel


class Channel:
    """Newline-delimited JSON over a pair of pipes; `receive` reads at most MAX_MESSAGE bytes per message."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd, self.buffer = read_fd, write_fd, b""

    def send(self, message, what: str = "a message") -> None:
        data = dumps(message).encode() + b"\n"
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"{what} of {len(data)} bytes exceeds the limit of {MAX_MESSAGE} bytes (MAX_MESSAGE)")
        view = memoryview(data)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def receive(self):
        end = self.buffer.find(b"\n")
        chunks, size = [self.buffer], len(self.buffer)
        while end < 0:
            if size > MAX_MESSAGE:
                raise ProtocolError(f"a message longer than the limit of {MAX_MESSAGE} bytes (MAX_MESSAGE)")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise ProtocolError("the other side closed the channel")
            end = chunk.find(b"\n")
            end = -1 if end < 0 else size + end
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        self.buffer = data[end + 1 :]
        try:
            return loads(data[:end].decode("ascii"))
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(f"not a JSON message: {type(exc).__name__}") from None


# ----------------------------------------------------------------------------------------------------- the candidate


def serve(namespace: dict, entry_point: str, channel: Channel) -> None:
    """In the candidate's process, after its program ran in `namespace`: answer calls of `entry_point` until the
    channel closes or a call raises. Nothing here is trusted: the program may have replaced any of it."""
    function = namespace.get(entry_point)
    if not callable(function):
        channel.send({"ready": False, "error": f"the program does not define a function {entry_point!r}"})
        return
    channel.send({"ready": True})
    while True:
        try:
            call = channel.receive()
        except ProtocolError:
            return
        reply = _answer(function, call)
        flush_streams()
        try:
            channel.send(reply, "the reply")
        except ValueError as exc:  # too long: say so (a closed channel would hide why)
            channel.send({"call": reply["call"], "error": str(exc)})
            return
        if "value" not in reply:
            return


def _answer(function, call: dict) -> dict:
    """Call `function` on fresh copies of the call's arguments. -> {"call", "value", "state"}: the value, and the new
    contents of each argument container the call changed (numbered as the checker numbered them), or {"call",
    "raised"} / {"call", "error"}."""
    decoder = Decoder()
    args = [decoder.value(a) for a in call["args"]]
    kwargs = {k: decoder.value(v) for k, v in call["kwargs"].items()}
    known = Encoder(decoder.objects)  # before the call every container is one of the arguments': all known
    before = {n: known.contents(obj) for n, obj in decoder.objects.items()}
    try:
        value = function(*args, **kwargs)
    except BaseException as exc:  # noqa: B036 -- a SystemExit from the function is an answer too: a failed one
        return {"call": call["call"], "raised": _describe(exc)}
    try:
        encoder = Encoder(decoder.objects)
        reply = {"call": call["call"], "value": encoder.value(value), "state": {}}
        for n, obj in decoder.objects.items():
            if (now := encoder.contents(obj)) != before[n]:
                reply["state"][str(n)] = now
        return reply
    except (ValueError, RecursionError) as exc:
        return {"call": call["call"], "error": str(exc)}


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:250]
    except Exception:  # noqa: BLE001 -- a __str__ that raises
        return type(exc).__name__


def flush_streams() -> None:
    """Flush stdout and stderr, whatever the program did to them (also used by the bootstrap)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 -- the program may have replaced or closed its streams
            pass


# ----------------------------------------------------------------------------------------------------- the checker


class CandidateFailure(Exception):
    """Raised in the test where the candidate gave no well-formed answer; the verdict fails whether or not the test
    catches it."""


class StandIn:
    """What the test calls instead of the candidate's function: each call goes to the candidate as data and its
    answer comes back as data (`decode`); the first bad answer is recorded in `failure` and fails the check."""

    def __init__(self, channel: Channel, name: str):
        self.channel, self.__name__, self.calls, self.failure = channel, name, 0, None

    def __call__(self, *args, **kwargs):
        if self.failure is None:
            n = self.calls  # this call's number (_call counts it)
            try:
                return self._call(args, kwargs)
            except CandidateFailure as exc:
                self.failure = str(exc)
            except Exception as exc:  # noqa: BLE001 -- any of them (OverflowError too): not a well-formed answer
                self.failure = f"call {n}: no well-formed answer ({type(exc).__name__}: {exc})"[:300]
        raise CandidateFailure(self.failure)

    def _call(self, args: tuple, kwargs: dict):
        n, self.calls = self.calls, self.calls + 1
        encoder = Encoder()
        try:
            message = {"call": n, "args": [encoder.value(a) for a in args]}
            message["kwargs"] = {k: encoder.value(v) for k, v in kwargs.items()}
            self.channel.send(message, "the call")
        except ValueError as exc:
            raise CandidateFailure(f"call {n}: the test's arguments cannot be sent ({exc})") from None
        reply = self.channel.receive()
        if not isinstance(reply, dict) or reply.get("call") != n:
            raise ProtocolError("an answer to another call")
        if "value" not in reply:
            raised, error = reply.get("raised"), reply.get("error")
            why = f"the function raised {raised}" if raised else f"its value cannot be sent: {error}"
            raise CandidateFailure(f"call {n}: {why}"[:300])
        decoder = Decoder(encoder.objects)  # {"ref": n} in the answer: the test's own argument containers
        value = decoder.value(reply["value"])
        state = reply["state"]
        if not isinstance(state, dict) or not all(k.isdigit() and int(k) in encoder.objects for k in state):
            raise ProtocolError("changes to containers that were not arguments")
        changes = [(encoder.objects[int(k)], tree) for k, tree in state.items()]
        for container, contents in [(c, decoder.contents(c, tree)) for c, tree in changes]:
            _replace(container, contents)  # after decoding all: new contents may refer to old containers
        return value


def run_checker(setup: str, test: str, entry_point: str, execute, channel: Channel) -> dict:
    """In the trusted checker's process: run `setup` and `test` (the dataset's, through `execute(source, filename,
    namespace)`), bind `entry_point` and `check`'s argument to the stand-in, wait for the candidate to be ready, run
    `check`. -> the verdict {"verdict": "passed" / "failed" / "error", "detail": str, "calls": int}."""
    import builtins

    if "random" in setup + test:  # tests that draw random inputs draw the same ones every time: same completion, same
        import random  # reward (the import is skipped where it is not needed: it costs the checker time)

        random.seed(0)
    namespace = {"__name__": "__check__", "__builtins__": builtins}
    try:
        execute(setup, "<setup>", namespace)
        execute(test, "<test>", namespace)
        check = namespace["check"]
    except BaseException as exc:  # noqa: B036 -- the dataset's own code failed: not the candidate's fault
        return {"verdict": "error", "detail": f"the test could not be loaded: {_describe(exc)}", "calls": 0}
    stand_in = StandIn(channel, entry_point)
    namespace[entry_point] = stand_in  # a test that calls the function by name (HumanEval/33) calls the candidate
    try:
        ready = channel.receive()
        if ready != {"ready": True}:
            error = ready.get("error") if isinstance(ready, dict) else None
            return {"verdict": "failed", "detail": f"the candidate is not ready: {str(error)[:300]}", "calls": 0}
        check(stand_in)
    except ProtocolError as exc:
        return {"verdict": "failed", "detail": f"the candidate: {exc}", "calls": stand_in.calls}
    except BaseException as exc:  # noqa: B036 -- whatever ended the test, it did not pass
        detail = stand_in.failure or f"the test failed: {_describe(exc)}{_where(exc)}"
        return {"verdict": "failed", "detail": detail, "calls": stand_in.calls}
    if stand_in.failure is not None:  # the test caught the stand-in's exception: still a failure
        return {"verdict": "failed", "detail": stand_in.failure, "calls": stand_in.calls}
    return {"verdict": "passed", "detail": "", "calls": stand_in.calls}


def _where(exc: BaseException) -> str:
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<test>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return "" if line is None else f" (test line {line})"
