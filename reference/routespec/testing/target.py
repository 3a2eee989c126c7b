"""The target protocol: what an adapter implements so the conformance suite can check it.

Everything here is plain data in the spec's vocabulary (error types as labels such as
``"CannotConnect"`` or ``"Backend(EngineShutdown)"``), so an adapter can drive any runtime,
in any language, without the suite knowing its internals. The calls are synchronous: an
adapter owns its event loop (trio, asyncio, a subprocess) and returns once the operation
has settled.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Literal, Protocol

import attrs


class Capability(enum.Enum):
    """What an adapter lets the suite control or observe. A check needing one it lacks is SKIP."""

    ROUND_ROBIN = "mode:round-robin"
    RANDOM = "mode:random"
    POWER_OF_TWO_CHOICES = "mode:power-of-two-choices"
    LEAST_LOADED = "mode:least-loaded"
    DEVICE_AWARE_WEIGHTED = "mode:device-aware-weighted"
    REFUSES_KV_AND_DIRECT = "mode:refuses-kv-and-direct"
    DIRECT = "call:direct"
    DIRECT_WITHIN = "call:direct-within"
    PRESELECTED = "call:preselected"
    REMOVE_WORKER = "cluster:remove-worker"
    KILL_WORKER = "cluster:kill-worker"
    VANISH_WORKER = "cluster:vanish-worker"
    MARK_OVERLOADED = "cluster:mark-overloaded"
    REPORT_DOWN = "cluster:report-down"
    DEVICE_TYPES = "cluster:device-types"
    SCRIPT_FAILURES = "worker:script-failures"
    SCRIPT_STALL = "worker:script-stall"
    SCRIPT_REJECTION = "worker:script-rejection"
    SCRIPT_WIRE_FAULTS = "worker:script-wire-faults"
    ANNOUNCE_REMOVAL = "cluster:announce-removal"
    KILL_WORKER_PROCESS = "cluster:kill-worker-process"
    OBSERVE_INFLIGHT = "observe:transport-inflight"
    OBSERVE_WORKER_BYTES = "observe:worker-bytes"
    OBSERVE_CONTROL_MESSAGE = "observe:control-message"
    OBSERVE_ERROR_TYPES = "observe:error-types"
    OBSERVE_WORKER_LOG = "observe:worker-log"
    """The target's workers log through Python's ``logging`` in the suite's process, on the
    logger ``routespec.worker``, so a check reads their lines with pytest's ``caplog``
    (spec: TRN-023)."""
    WIRE_TRANSPORT = "transport:dynamo-wire"
    FIRST_RESPONSE_GUARD = "call:first-response-guard"
    BIDIRECTIONAL = "call:bidirectional"
    MIGRATION = "call:migration"
    MOCK_CLOCK = "time:mock-clock"
    REAL_CLOCK = "time:real-clock"
    """The target runs on real time with the spec's default deadlines, and the suite may wait
    them out (only stages whose default is at most 30 s are checked this way)."""
    CONFIGURE_INHIBITION = "config:inhibited-duration"
    OBSERVE_WORKER_SETS = "observe:worker-sets"
    OBSERVE_OCCUPANCY = "observe:occupancy"
    OBSERVE_PREPARED_TARGET = "observe:prepared-target"
    OBSERVE_LISTED_CODEC = "observe:listed-codec"
    """A watcher's listing names the payload codec a caller speaks to each instance
    (``ListedInstance.payload_codec``, spec: DSC-001, DSC-007)."""
    ERROR_MODEL = "errors:model"
    ROUTING_HOST = "host:routing-host"
    DISCOVERY_STORE = "discovery:store"
    SCRIPT_SILENCE = "worker:script-silence"
    SCRIPT_TRICKLE = "worker:script-trickle"
    CONFIGURE_TIMEOUTS = "config:timeouts"
    SCRIPT_REASONS = "worker:script-reasons"  # an ErrorSpec's explicit reason reaches the caller
    WORKER_LIMITS = "worker:limits"
    REPORT_LOAD = "cluster:report-load"
    """Workers' load reports reach the router's load monitor (``Target.report_load``), under
    the busy thresholds of ``TargetConfig.load_thresholds`` (spec: SET-005)."""
    KV_INDEX_BOUND = "host:kv-index-bound"
    """The KV host's index keeps a count of blocks per worker, ``HostConfig.kv_index_blocks``
    (spec: KVS-017)."""
    AFFINITY_CAP = "host:affinity-cap"
    """The host's session-affinity table can be filled to its cap through
    ``RoutingHostTarget.bind_session`` in seconds (65,536 sessions by default, AFF-004)."""
    RESPONSE_REUSE = "transport:response-reuse"
    """Raw requests to a worker's served path (``Target.worker_path``), for the checks of
    the reference's response-connection reuse (spec: TRN-028, TRN-029)."""
    SCRIPT_NAMES = "worker:script-names"
    """The target's workers resolve the host names a check sets (``Target.resolve_name``:
    names under ``.invalid``, RFC 6761) to the addresses it gives, or never answer for them,
    on the target's clock (spec: TRN-027)."""
    DRAIN_WORKER = "cluster:drain-worker"
    """A worker can be told to shut down gracefully (``Target.drain_worker``, TRN-037)."""
    PACED_READS = "caller:paced-reads"
    """The caller of a request reads its items only when the check says so
    (``Target.pace_reads``, ``Target.read``): a rule about what the caller sees when it takes
    an item, or what a stop between two reads does, is observed at that moment."""
    STARVE_CALLER = "caller:starve-descriptors"
    """The caller's process can be left without free file descriptors while its workers,
    separate processes (``Target.add_worker_process``), keep theirs (``Target.starve_caller``,
    spec: TRN-056)."""
    CHECK_LOAD_THRESHOLDS = "config:check-load-thresholds"
    """Construction-time validation of busy thresholds (``Target.check_load_thresholds``,
    spec: SET-006)."""
    """Workers with given connection, idle and buffer limits, and raw request-plane
    connections held open to them (spec: TRN-024 … TRN-026)."""


@attrs.frozen
class ErrorSpec:
    """A typed error to inject or to describe: a type label (None = untyped), a message, a cause."""

    type: str | None
    message: str = "injected"
    cause: ErrorSpec | None = None
    reason: str | None = None  # other than the type's default (Capability.SCRIPT_REASONS)

    def chain(self) -> tuple[ErrorSpec, ...]:
        links: list[ErrorSpec] = []
        link: ErrorSpec | None = self
        while link is not None:
            links.append(link)
            link = link.cause
        return tuple(links)


# --- worker scripts: how a worker answers every request until it is scripted again ---


@attrs.frozen
class Serve:
    """Yield ``items`` data items, then end the stream cleanly.

    Every scripted data item is ``{"worker": id, "request": request_id, "index": n}`` with
    ``n`` counting from 0 across the whole stream, so checks can see loss, reordering and
    which worker produced it (a text request's items are text: ``Migrate``'s ``form``).
    With ``close_fault``, the stream raises ``RuntimeError(close_fault)`` if the worker
    closes it before its end (a handler's fault in its own cleanup).
    """

    items: int = 1
    close_fault: str | None = None


@attrs.frozen
class FailBeforeStream:
    """Refuse the request before any response item exists."""

    error: ErrorSpec


@attrs.frozen
class FailMidStream:
    """Yield ``items`` data items, then one error item."""

    items: int
    error: ErrorSpec


@attrs.frozen
class Crash:
    """Yield ``items`` data items, then raise plain ``RuntimeError(message)``s, not typed
    errors: one, or for two or more messages an ``ExceptionGroup`` of them (a handler's own
    fault). With ``at_start`` the handler's ``start`` raises them, before any stream; with
    ``at_admission`` its admission check does, before the worker's ACK (a reference worker's
    ``WorkerHandler.admit``; spec: TRN-023)."""

    items: int
    messages: tuple[str, ...] = ("boom",)
    at_start: bool = False
    at_admission: bool = False


@attrs.frozen
class Stall:
    """Yield ``items`` data items, then wait until released, then yield ``items_after`` more."""

    items: int = 0
    items_after: int = 1


@attrs.frozen
class Reject:
    """Refuse at the door: the worker's ACK reads ``Server overloaded: …`` (``overloaded``)
    or ``Server unavailable: …``."""

    overloaded: bool = True
    message: str = "injected"


class WireFault(enum.Enum):
    """Ways a worker can break the response-stream protocol (wire targets only)."""

    EOF_BEFORE_FINAL = "eof-before-final"
    FRAME_AFTER_FINAL = "frame-after-final"
    EMPTY_FRAME = "empty-frame"
    GARBLED_FRAME = "garbled-frame"
    NO_CALL_HOME = "no-call-home"  # ACK the request, never open its response stream
    RESET_BEFORE_FINAL = "reset-before-final"  # the items read, the connection reset (RST)
    LATE_SENTINEL = "late-sentinel"  # complete_final, then the sentinel 0.1 s later
    CUT_IN_PREFIX = "cut-in-prefix"  # 10 bytes of a frame's 24-byte prefix, then the close
    RESET_AFTER_SENTINEL = "reset-after-sentinel"  # the final frame, sentinel, reset (RST)
    # The two below then read what the caller writes on the stream (Target.control_words):
    LISTEN = "listen"  # nothing more written; read until the caller closes the connection
    FRAME_AFTER_SENTINEL = "frame-after-sentinel"  # final frame, sentinel, a data frame in
    # one write; read until the caller closes or for 1 s of the target's clock, then close


@attrs.frozen
class Misbehave:
    """Yield ``items`` data items, then commit ``fault`` on the wire."""

    items: int
    fault: WireFault


@attrs.frozen
class WriteErrorItem:
    """Yield ``items`` data items, then write one error item whose ``error`` is the JSON text
    ``error``, verbatim, then end the stream: an error as another runtime may write it, in a
    shape the target's own workers need not write (wire targets only,
    Capability.SCRIPT_WIRE_FAULTS)."""

    items: int
    error: str


@attrs.frozen
class WriteFrame:
    """Yield ``items`` data items, then write one two-part frame whose header is the bytes
    ``header`` and whose body is the JSON text ``body`` in the stream's payload codec (None:
    no body), its prefix declaring ``header_length`` and ``body_length`` (None: the part's true
    length) as the parts' lengths, then end the stream as ``Serve`` does: a frame another
    runtime may write, or bytes no frame should be (wire targets only,
    Capability.SCRIPT_WIRE_FAULTS)."""

    items: int
    header: bytes = b""
    body: str | None = None
    header_length: int | None = None
    body_length: int | None = None


@attrs.frozen
class WritePrologue:
    """Answer with a prologue whose header is the JSON text ``prologue``, verbatim — as
    another runtime may write it, such as Dynamo 1.6.1's ``{"error": "…"}`` without a typed
    error — then ``items`` data items and the end of the stream as ``Serve`` does (a caller
    the prologue failed ignores them) (wire targets only, Capability.SCRIPT_WIRE_FAULTS)."""

    prologue: str
    items: int = 1


@attrs.frozen
class WriteAck:
    """Answer with an ACK whose text is the bytes ``text``, its ``u32`` prefix declaring
    ``length`` (None: the text's true length), and nothing more: no response stream follows;
    with ``close``, then close the request-plane connection; with ``cut``, only the first
    ``cut`` bytes of the prefix and text are sent (wire targets only,
    Capability.SCRIPT_WIRE_FAULTS)."""

    text: bytes
    length: int | None = None
    close: bool = False
    cut: int | None = None


@attrs.frozen
class WriteAcks:
    """Answer the requests that arrive on one request-plane connection with ACKs whose texts
    are ``texts``, in turn, and nothing more: an ACK is held until ``len(texts)`` are held on
    the connection, or 0.5 s of the target's clock after the first of them, and the held ACKs
    then go out in one write, as a worker working through a queue writes them; with
    ``split``, that write stops ``split`` bytes into the text of its last ACK, whose rest
    follows 0.1 s later (wire targets only, Capability.SCRIPT_WIRE_FAULTS)."""

    texts: tuple[bytes, ...]
    split: int | None = None


@attrs.frozen
class CancelThenFail:
    """Yield ``items`` data items, then a terminal frame (``finish_reason: "cancelled"``),
    then one error item: an engine shutting down under a request."""

    items: int
    error: ErrorSpec


@attrs.frozen
class TerminalThen:
    """Yield ``items`` data items, then a terminal frame with ``finish_reason`` ``finish``,
    then ``items_after`` more data items (no finish reason); then, if ``stall``, wait until
    released; then one error item if ``error`` is given; then end the stream."""

    items: int = 0
    finish: str = "cancelled"
    stall: bool = False
    error: ErrorSpec | None = None
    items_after: int = 0


@attrs.frozen
class TerminalFlood:
    """Send a terminal frame (``finish_reason: "cancelled"``) every ``interval`` seconds of
    the target's clock, forever: a worker that never lets a drain end by itself."""

    interval: float = 1.0


class SilentStage(enum.Enum):
    """Where on Dynamo's wire a worker can go silent (spec: TMO), in the order a request
    meets them."""

    CONNECT = "connect"  # its request-plane port never completes a TCP connection
    ACK = "ack"  # it reads the request and never ACKs it
    DIAL_BEFORE_ACK = "dial-before-ack"  # it dials back and introduces the request's streams
    # (response, and a bidirectional request's request stream), its ACK still unsent
    DIAL_BACK = "dial-back"  # it ACKs and never dials the caller's response-stream address
    HANDSHAKE = "handshake"  # it dials back and sends the handshake, never the prologue


@attrs.frozen
class Silent:
    """Go silent at ``stage`` of the wire exchange and stay silent until released; then carry
    on as ``Serve(items)`` (wire targets only, Capability.SCRIPT_SILENCE).

    A worker silent at ``CONNECT`` takes no connection at all until it is scripted again;
    ``release_stalled`` does not reach it. A worker silent at ``ACK`` holds its request-plane
    connection, so later requests on that connection wait behind the silent one, as they
    would behind a stopped process.
    """

    stage: SilentStage
    items: int = 1


@attrs.frozen
class Trickle:
    """Yield ``items`` data items, one every ``interval`` seconds of the target's clock (the
    first at once), then end the stream cleanly: a slow worker that never stops answering
    (Capability.SCRIPT_TRICKLE). A token request gets its whole ``max_tokens`` this way."""

    items: int = 3
    interval: float = 1.0


WorkerScript = (
    Serve
    | FailBeforeStream
    | FailMidStream
    | Crash
    | Stall
    | Reject
    | Misbehave
    | WriteErrorItem
    | WriteFrame
    | WritePrologue
    | WriteAck
    | WriteAcks
    | CancelThenFail
    | TerminalThen
    | TerminalFlood
    | Silent
    | Trickle
)


# --- router calls ---


@attrs.frozen
class Generate:
    """``generate()`` with a router mode label such as ``"round-robin"``."""

    mode: str


@attrs.frozen
class Direct:
    """Exact dispatch to one worker id."""

    worker_id: int
    payload: object = None
    """The request's payload as the caller passes it (None: the adapter's own), for a wire
    target to encode in the worker's codec (Capability.WIRE_TRANSPORT)."""
    prepared: bool = True
    """False: the caller gives the router no prepare step (Dynamo's ``direct(request, id)``
    has none), so the request reaches the worker as the caller passed it."""


@attrs.frozen
class DirectWithin:
    """Dispatch to a target with fallback anywhere (``allowed=None``) or only inside ``allowed``."""

    worker_id: int
    allowed: frozenset[int] | None


@attrs.frozen
class Preselected:
    """Book the worker (as an occupancy policy would), then dispatch to it as preselected."""

    worker_id: int


@attrs.frozen
class Bidirectional:
    """``generate()`` with a streamed request of ``inputs`` items (0, 1, …). A scripted
    worker answers each input with ``{"worker", "request", "input": n}``, then its script.
    With ``more``, the caller's request stream neither ends nor yields another item after
    them: its next input is still pending when the request ends."""

    mode: str
    inputs: int
    more: bool = False


@attrs.frozen
class Migrate:
    """A token request through migration: prompt tokens ``0 .. prompt-1``, ``max_tokens`` to
    generate, sent by ``generate(mode)`` or, with ``pin``, exactly to that worker.

    A scripted worker answers a token request with one token per item, each the position
    it continues (``prompt length + i``), the last with ``finish_reason: "stop"``; its script
    decides where it fails (``FailMidStream(k, …)`` fails after ``k`` tokens). So a request
    that completes must read exactly ``prompt, prompt+1, …, prompt+max_tokens-1``.
    ``stopped`` marks the caller's context stopped before the first attempt; ``stop_after``
    stops it as soon as the request has reached that many workers (its dispatch log), so an
    attempt after that one meets a stopped context (MIG-006).

    ``form`` "map" sends a request that is not a token request: a map carrying the prompt as
    text (``{"prompt": "0 1 2 3", "max_tokens": …}``), answered with ``Serve``'s map items,
    which carry no tokens; "text" sends the prompt as a bare string, answered with text items
    (``"worker W request R item N"``). Both migrate only before their stream (MIG-008).
    """

    mode: str = "round-robin"
    limit: int = 3
    prompt: int = 4
    max_tokens: int = 6
    min_tokens: int = 0
    n: int = 1
    guided: bool = False
    max_seq_len: int | None = None
    pin: int | None = None
    stopped: bool = False
    stop_after: int | None = None
    form: Literal["tokens", "map", "text"] = "tokens"


@attrs.frozen
class HostRoute:
    """A token request through the routing host (Capability.ROUTING_HOST).

    The prompt is ``tokens``; a scripted worker answers with ``max_tokens`` tokens as for
    ``Migrate``. ``phase`` is ``aggregated``, ``prefill`` or ``decode``; the worker fields
    are Dynamo's ``nvext`` routing fields; ``session`` is a session-affinity id; ``lora``
    an adapter name; ``allowed`` and ``required_taints`` constrain the workers; ``excluded``
    are workers a previous attempt already failed on, each recorded with a
    ``WorkerOverloaded`` failure (so an exhausted set is ``ResourceExhausted``, MIG-012).
    ``stopped`` marks the caller's context stopped before routing starts; ``staged_kv`` marks
    a decode leg whose prefill left KV blocks to release. With ``migration_limit`` the
    request goes through migration.
    """

    phase: str = "aggregated"
    backend_instance_id: int | None = None
    decode_worker_id: int | None = None
    prefill_worker_id: int | None = None
    dp_rank: int | None = None
    session: str | None = None
    lora: str | None = None
    allowed: frozenset[int] | None = None
    required_taints: frozenset[str] = frozenset()
    excluded: frozenset[int] = frozenset()
    tokens: tuple[int, ...] = (1,)
    max_tokens: int = 1
    staged_kv: bool = False
    stopped: bool = False
    migration_limit: int | None = None


Call = Generate | Direct | DirectWithin | Preselected | Bidirectional | Migrate | HostRoute


# --- observations ---


@attrs.frozen
class ObservedError:
    """A failure as the caller saw it: its chain of (type label or None, message), outermost first.

    ``pre_stream`` is True when the call itself failed, False for an error item in the stream.
    """

    links: tuple[tuple[str | None, str], ...]
    pre_stream: bool
    error_class: str | None = None
    """The normalised class the caller saw (``Unavailable``, ``CapacityExhausted``, …)."""
    types_observed: bool = True
    """False when the target shows only the class and text (links then carry no types)."""

    @property
    def type(self) -> str | None:
        return self.links[0][0]

    @property
    def typed_chain(self) -> tuple[str, ...]:
        return tuple(label for label, _ in self.links if label is not None)

    def describe(self) -> str:
        where = "before the stream" if self.pre_stream else "as a stream item"
        if not self.types_observed:
            return f"class {self.error_class}: {self.links[0][1]} ({where}; types not observable)"
        chain = " <- ".join(f"{label or 'untyped'}: {message}" for label, message in self.links)
        return f"{chain} ({where})"


@attrs.frozen
class Outcome:
    """How a request ended: its data items, at most one error, and whether the caller dropped it."""

    items: tuple[object, ...]
    error: ObservedError | None
    dropped: bool = False
    bookings_at_error: Mapping[int, int] | None = None
    """For a routing-host request that ended with an error item: the host's bookings at the
    moment the caller received that item."""
    occupancy_at_error: Mapping[int, int] | None = None
    """For a request that ended with an error item, on a target that observes occupancy
    (Capability.OBSERVE_OCCUPANCY): the router's occupancy at the moment the caller received
    that item, before it read on or closed the stream (DSP-011)."""


@attrs.frozen
class Delivery:
    """One request arriving at one worker (the dispatch log)."""

    request_id: str
    worker_id: int
    prepared_for: int | None = None
    payload: object = None
    """The request as this worker received it (for token requests: prompt and budgets)."""


@attrs.frozen
class WorkerSetsView:
    discovered: frozenset[int]
    routable: frozenset[int]
    overloaded: frozenset[int]
    free: frozenset[int]


@attrs.frozen
class Timeouts:
    """The router's caller-side deadlines in seconds (spec: TMO); ``None`` keeps the
    target's default for that stage (Capability.CONFIGURE_TIMEOUTS to set any)."""

    connect: float | None = None
    ack: float | None = None
    establish: float | None = None
    first_item: float | None = None
    inactivity: float | None = None


@attrs.frozen
class WorkerBounds:
    """What peers may hold of a worker (spec: TRN-024 … TRN-026): request-plane connections
    at once, seconds a connection may stay silent, request bytes buffered over all its
    connections, and the hosts it dials back to (TRN-027: ``peer``, ``any``, IP addresses or
    networks, comma-separated, as ``routespec worker --dial-back-hosts`` takes them); ``None``
    keeps the implementation's own default (Capability.WORKER_LIMITS)."""

    max_connections: int | None = None
    idle_timeout: float | None = None
    max_buffered_bytes: int | None = None
    dial_back_hosts: str | None = None
    open_file_limit: int | None = None
    """The soft open-file limit (``RLIMIT_NOFILE``) the worker's process runs under when its
    server starts (None: the target's own), which its default cap derives from (TRN-024)."""


@attrs.frozen
class HeldConnection:
    """What a worker did on a held request-plane connection so far: the ACK texts it sent
    (``""`` accepts a request), whether it closed the connection, and the bytes it wrote
    after its last whole ACK (none when it wrote only ACKs)."""

    acks: tuple[str, ...]
    closed: bool
    trailing: bytes = b""


@attrs.frozen
class LoadThresholds:
    """The router's busy thresholds in Dynamo's names (spec: SET-005), each ``None`` when
    unset. Plain data: out-of-range values are for ``Target.check_load_thresholds``."""

    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: int | None = None
    active_prefill_tokens_threshold_frac: float | None = None


@attrs.frozen
class LoadReport:
    """A worker's load as the router's load monitor sees it (spec: SET-005):
    ``kv_total_blocks`` 0 is unknown; ``max_num_batched_tokens`` None is not reported."""

    active_decode_blocks: int = 0
    kv_total_blocks: int = 0
    active_prefill_tokens: int = 0
    max_num_batched_tokens: int | None = None


@attrs.frozen
class TargetConfig:
    """Per-test settings. ``seed`` fixes the target's randomness (Random, P2C); ``None``
    leaves the router its own, as a deployment's is. Any other setting left ``None`` keeps
    the implementation's own default too, so the checks that leave it so judge the default
    the spec states (FLT-001's 5 s, SEL-010's ratio 8, FLT-009's fault detection on)."""

    seed: int | None = 0
    inhibited_duration: float | None = None
    fault_detection: bool | None = None
    device_ratio: int | None = None
    timeouts: Timeouts = Timeouts()
    load_thresholds: LoadThresholds = LoadThresholds()  # none set (Capability.REPORT_LOAD)


@attrs.frozen
class HostConfig:
    """How a routing host is built: its policy (a builtin mode label, ``direct`` or ``kv``),
    session affinity (off when ``affinity_ttl`` is None; ``hard`` or ``soft``), LoRA
    filtering, and the KV selector's settings (``None``: the implementation's default)."""

    policy: str = "round-robin"
    affinity_ttl: float | None = None
    affinity_mode: str | None = None  # None: the implementation's default (AFF-006: hard)
    max_affinity_entries: int | None = None  # None: its own cap (AFF-004: 65,536)
    lora: bool = False
    temperature: float = 0.0
    block_size: int = 16
    kv_index_blocks: int | None = None  # None: the implementation's own bound (KVS-017)


@attrs.frozen
class PlanView:
    """A previewed or planned route: its id, its worker, and its cleanup budget left."""

    plan_id: int
    worker_id: int
    budget_remaining: float


@attrs.frozen
class SessionView:
    """``state``: ``disabled`` (no coordinator), ``unbound``, ``initializing`` or ``bound``."""

    state: str
    worker_id: int | None = None
    dp_rank: int | None = None


@attrs.frozen
class HostView:
    """The worker inputs the host's policy declares and those the host built."""

    required_inputs: frozenset[str]
    constructed_inputs: frozenset[str]


class RoutingHostTarget(Protocol):
    """The routing host of a target (Capability.ROUTING_HOST). Its requests share the
    target's dispatch log and outcomes."""

    def route(self, route: HostRoute) -> str:
        """Start a request through the host; returns its id once it has settled."""
        ...

    def stop(self, request_id: str) -> None:
        """The caller's context stops (a client stop), while the caller still reads."""
        ...

    def preview(self, route: HostRoute) -> PlanView | ObservedError: ...
    def plan(self, preview_id: int) -> PlanView | ObservedError: ...
    def dispatch_plan(self, plan_id: int, *, stop_first: bool = False) -> str:
        """Dispatch a plan (its caller stopped first, if ``stop_first``); returns the id of
        the request, whose outcome the target reports (a plan used before fails it)."""
        ...

    def abort_plan(self, plan_id: int) -> ObservedError | None:
        """Abandon a plan; a plan already dispatched or aborted answers with the error."""
        ...

    def prefill_busy(self, route: HostRoute, threshold: float) -> bool: ...

    def bind_session(self, session: str, worker_id: int, dp_rank: int | None = None) -> None:
        """Initialize ``session`` and commit this target, as a first request would."""
        ...

    def hold_session(self, session: str) -> None:
        """Start initializing ``session`` and keep the initialization pending."""
        ...

    def release_session(self, session: str) -> None:
        """Drop the initialization ``hold_session`` keeps pending."""
        ...

    def session(self, session: str) -> SessionView: ...
    def configure_worker(
        self, worker_id: int, *, taints: frozenset[str] = frozenset(), dp_size: int = 1
    ) -> None:
        """The worker's runtime configuration as the selector sees it."""
        ...

    def forget_worker_config(self, worker_id: int) -> None:
        """The selector has not yet seen the worker's configuration (a config-watch gap)."""
        ...

    def set_lora_replicas(self, adapter: str, workers: frozenset[int]) -> None: ...
    def bookings(self) -> Mapping[int, int]:
        """Admitted requests per worker in the host's load input (occupancy or KV)."""
        ...

    def counters(self) -> tuple[int, int]:
        """(requests started, requests completed)."""
        ...

    def lora_inflight(self) -> Mapping[str, int]: ...
    def inputs(self) -> HostView: ...


@attrs.frozen
class DiscoveryTiming:
    """A discovery store's periods in seconds (spec: DSC): a record not renewed for ``ttl`` is
    dead; a running process renews its record every ``renewal``; a change reaches a watcher
    within ``propagation``."""

    ttl: float
    renewal: float
    propagation: float


@attrs.frozen
class ListedInstance:
    """An instance as a watcher resolves it: its transport address and device type, and the
    payload codec a caller speaks to it where the target says (None where it does not:
    Capability.OBSERVE_LISTED_CODEC)."""

    address: str | None
    device_type: str | None
    payload_codec: str | None = None


@attrs.frozen
class StoredRecord:
    """An instance's record as the store holds it: its key in Dynamo's key space
    (``v1/instances/ns/comp/endpoint/<hex id>``) and its value."""

    key: str
    value: bytes


class DiscoveryTarget(Protocol):
    """A discovery store of a target (Capability.DISCOVERY_STORE), empty when opened: worker
    processes register instance records in it, watchers follow an endpoint's records."""

    def address(self) -> str:
        """The store as ``--discovery`` spells it (``file:DIR``, ``etcd:URL``)."""
        ...

    def timing(self) -> DiscoveryTiming:
        """The periods the store really uses."""
        ...

    def register(self, endpoint: str, *, device: str = "cuda") -> int:
        """A worker process registers an instance of ``endpoint`` and keeps it alive; returns
        its instance id."""
        ...

    def register_refusal(
        self, endpoint: str, *, device: str = "cuda", host: str = "127.0.0.1"
    ) -> str | None:
        """A worker process serving at ``host`` tries to register an instance of
        ``endpoint`` with device type ``device``: the option its typed refusal
        (``DiscoveryError``) names (``--endpoint``, ``--host``, ``--device-type``), or None
        when it registered (it then keeps running, as after ``register``)."""
        ...

    def withdraw(self, instance_id: int) -> None:
        """The process withdraws its registration (a clean shutdown's first step) and keeps
        running."""
        ...

    def lapse(self, instance_id: int) -> None:
        """The process stops renewing without withdrawing (it is killed with SIGKILL)."""
        ...

    def put_raw(self, endpoint: str, instance_id: int, value: bytes) -> None:
        """Another process stores ``value`` as the record of ``instance_id`` under
        ``endpoint``'s key, and never renews it."""
        ...

    def put_raw_key(self, key: str, value: bytes) -> None:
        """Another process stores ``value`` under ``key``, any key of Dynamo's key space
        (``v1/instances/<ns>/<comp>/<endpoint>/<anything>``, not only an instance's hex id),
        and never renews it."""
        ...

    def lose_records(self) -> None:
        """The store loses every record (wiped, or restarted without its data) while the
        registered processes keep running."""
        ...

    def watch(self, endpoint: str) -> int:
        """Start a watcher of ``endpoint``; returns its id once its first read is done."""
        ...

    def listed(self, watcher: int) -> Mapping[int, ListedInstance]:
        """The instances the watcher lists now."""
        ...

    def events(self, watcher: int) -> tuple[tuple[str, int], ...]:
        """The changes reported to the watcher so far, in order: ``("added" | "removed", id)``."""
        ...

    def skipped(self, watcher: int) -> tuple[tuple[str, str], ...]:
        """The records the watcher reported skipping as unusable (DSC-014), in order, as
        ``(key, field)``: the key as ``v1/instances/<ns>/<comp>/<endpoint>/<hex id>``."""
        ...

    def record(self, instance_id: int) -> StoredRecord | None:
        """The record the store holds now for an instance registered or put here, or None."""
        ...

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of the store's time pass: renewals, polls and expiries that fall due
        happen before it returns."""
        ...

    def refusal(self, address: str, ttl: float) -> str | None:
        """Open the store ``address`` names with liveness period ``ttl`` and check that it can
        be used, as a router starting on it does (up to its watcher's first read): the
        argument its typed refusal names (``--discovery``, ``--ttl``), or None."""
        ...

    def reopen(
        self,
        *,
        ttl: float | None = None,
        environment: Mapping[str, str] | None = None,
        store: str | None = None,
    ) -> DiscoveryTarget:
        """Another store, opened as a worker process opens one: with ``--ttl ttl`` (None: no
        ``--ttl``, the implementation's default), and ``--discovery`` naming a new empty store,
        or, when ``environment`` is given, no ``--discovery`` and, of the environment variables
        that choose a store (``DYN_FILE_KV``, ``TMPDIR``), just ``environment``'s; that store
        may hold other processes' records. Its instances take the implementation's own ids.
        ``store`` chooses the new store's kind: ``"file"``, ``"etcd"`` (a new etcd server, at
        ``etcd:http://HOST:PORT``), or None for this store's own kind."""
        ...


class Target(Protocol):
    """One running system under test: a cluster of workers and one router in front of them."""

    # cluster control
    def add_worker(self, *, device: str = "cuda") -> int: ...
    def add_worker_process(self, script: WorkerScript) -> int:
        """Start a worker as a separate OS process that serves ``script`` for every request,
        registered with discovery like ``add_worker`` (Capability.KILL_WORKER_PROCESS);
        ``kill_worker`` then kills the process (SIGKILL) and returns once it has exited."""
        ...

    def remove_worker(self, worker_id: int) -> None: ...
    def set_device(self, worker_id: int, device: str) -> None:
        """Discovery lists ``worker_id`` again, now with device type ``device``: its record
        was rewritten (Capability.DEVICE_TYPES)."""
        ...

    def kill_worker(self, worker_id: int) -> None: ...
    def drain_worker(self, worker_id: int, grace_period: float) -> None:
        """The worker starts a graceful shutdown with ``grace_period`` seconds for the streams
        it has open (a SIGTERM to a worker process; Capability.DRAIN_WORKER)."""
        ...

    def vanish_worker(self, worker_id: int) -> None:
        """The worker's transport record disappears while the router still lists it."""
        ...

    def announce_removal(self, worker_id: int, removed: bool) -> None:
        """Discovery's watcher tells the transport the worker was removed (or added back)
        while the router's cached list still lists it (Capability.ANNOUNCE_REMOVAL)."""
        ...

    def script_worker(self, worker_id: int, script: WorkerScript) -> None: ...
    def release_stalled(self, worker_id: int) -> None: ...
    def mark_overloaded(self, worker_id: int, overloaded: bool) -> None: ...
    def report_load(self, worker_id: int, report: LoadReport) -> None:
        """The worker's load report reaches the router's load monitor and replaces its
        earlier one; returns once the monitor's verdicts are published
        (Capability.REPORT_LOAD)."""
        ...

    def check_load_thresholds(self, thresholds: LoadThresholds) -> ObservedError | None:
        """Construct a router with ``thresholds``: the error its construction failed with,
        or None when it was built (Capability.CHECK_LOAD_THRESHOLDS)."""
        ...

    def report_down(self, worker_id: int) -> None: ...
    def advance_time(self, seconds: float) -> None: ...

    # router operations
    def submit(
        self, call: Call, metadata: Mapping[str, str] | None = None, guarded: bool = False
    ) -> str:
        """Start a request and return its id once it has settled (finished, or stalled).

        ``metadata`` travels with the request (on Dynamo's wire: the control message);
        ``guarded`` gives it a first-response guard (Capability.FIRST_RESPONSE_GUARD)."""
        ...

    def pace_reads(self, paced: bool) -> None:
        """Requests started from now on (``submit``, ``RoutingHostTarget.route``) are read
        only as far as ``read`` allows: their caller holds off each read, the worker's items
        waiting for it (Capability.PACED_READS)."""
        ...

    def read(self, request_id: str, items: int = 1) -> None:
        """The caller of a paced request reads ``items`` more times (an item, the end or an
        error each); returns once the system has settled."""
        ...

    def outcome(self, request_id: str) -> Outcome | None:
        """The request's outcome, or None while its stream is still open."""
        ...

    def drop(self, request_id: str) -> None:
        """The caller abandons an open stream."""
        ...

    # observations
    def dispatch_log(self) -> Sequence[Delivery]: ...
    def worker_sets(self) -> WorkerSetsView: ...
    def occupancy(self) -> Mapping[int, int]: ...
    def held_guards(self) -> int:
        """First-response guards not yet released (Capability.FIRST_RESPONSE_GUARD)."""
        ...

    def transport_inflight(self) -> int:
        """Dispatches the transport counts as in flight (Capability.OBSERVE_INFLIGHT)."""
        ...

    def response_connections(self) -> int:
        """Response-stream connections the caller holds open or waits on: streams being
        read (a bidirectional request's request stream too) and connections released to
        their workers for reuse (0 for a transport with none; Capability.OBSERVE_INFLIGHT)."""
        ...

    def worker_bytes(self, worker_id: int) -> int:
        """Request-plane bytes the worker has received (Capability.OBSERVE_WORKER_BYTES)."""
        ...

    def control_message(self, request_id: str) -> Mapping[str, object] | None:
        """The control message a worker read for ``request_id``, its JSON header decoded
        (``connection_info.info`` stays the string it is on the wire), or None if no worker
        read one (Capability.OBSERVE_CONTROL_MESSAGE)."""
        ...

    def control_words(self, request_id: str) -> Sequence[object]:
        """What a worker scripted to read it (``WireFault.LISTEN``,
        ``WireFault.FRAME_AFTER_SENTINEL``) read from the caller on ``request_id``'s
        response stream, in order: each frame's header decoded from JSON (``"kill"``), None
        for a frame without a header (Capability.OBSERVE_CONTROL_MESSAGE)."""
        ...

    def send_raw(self, worker_id: int | None, data: bytes) -> None:
        """Open a connection to the worker's request-plane port (or, for None, the router's
        response-stream port), write ``data``, close it (Capability.WIRE_TRANSPORT)."""
        ...

    def worker_path(self, worker_id: int) -> str:
        """The endpoint path the worker serves on its request plane, as a raw request names
        it (Capability.RESPONSE_REUSE)."""
        ...

    def reused_streams(self, worker_id: int) -> int:
        """Response streams the worker has written so far on a connection a caller released
        to it, rather than on one dialled for them (Capability.RESPONSE_REUSE)."""
        ...

    def resolve_name(self, name: str, addresses: Sequence[str] | None) -> None:
        """From now on the target's workers resolve ``name`` (one under ``.invalid``) to
        ``addresses`` (IP literals) at once, or with None never answer for it
        (Capability.SCRIPT_NAMES)."""
        ...

    def starve_caller(self, spare: int | None) -> None:
        """Leave the caller's process only ``spare`` free file descriptors (its soft
        open-file limit lowered, every other descriptor under it held open), or with None
        give it back what it had (Capability.STARVE_CALLER)."""
        ...

    # raw connections held open to a worker (Capability.WORKER_LIMITS)
    def add_bounded_worker(self, bounds: WorkerBounds) -> int:
        """A worker like ``add_worker``'s whose request-plane server keeps ``bounds``."""
        ...

    def open_file_limit(self, worker_id: int) -> int:
        """The soft open-file limit (``RLIMIT_NOFILE``) of the worker's process."""
        ...

    def worker_address(self, worker_id: int) -> str:
        """The ``host:port`` of the worker's request plane, as its discovery record gives it
        to callers."""
        ...

    def connect(self, worker_id: int) -> int:
        """Open a request-plane connection to the worker and hold it; returns its handle
        once the worker has accepted it (or closed it)."""
        ...

    def write(self, connection: int, data: bytes) -> HeldConnection:
        """Write ``data`` on a held connection; returns once the worker has read and
        answered what it will, with what it did on the connection so far."""
        ...

    def held(self, connection: int) -> HeldConnection:
        """What the worker did on a held connection so far (after time the check moved)."""
        ...

    def disconnect(self, connection: int) -> None:
        """Close a held connection from the peer's side."""
        ...

    def open_host(self, config: HostConfig) -> RoutingHostTarget | ObservedError:
        """Build a routing host over this target's workers (Capability.ROUTING_HOST), or the
        error its construction failed with."""
        ...

    def open_discovery(self) -> DiscoveryTarget:
        """Open an empty discovery store (Capability.DISCOVERY_STORE)."""
        ...

    # the error model as a library (Capability.ERROR_MODEL)
    def match_error_chain(
        self, chain: Sequence[str | None], include: Sequence[str], exclude: Sequence[str]
    ) -> bool: ...
    def classify(self, error: ErrorSpec) -> tuple[str, str]:
        """The normalised (class, reason) of an error built from ``error``; ``ValueError``
        when the error cannot be built (an explicit reason ERR-004 forbids)."""
        ...

    def bounded_message(self, message: str) -> str: ...


class Adapter(Protocol):
    """A named way to run targets, with its declared capabilities and expected failures.

    ``expected_failures`` maps a check's name to the evidence that the target diverges from
    the spec there; such checks are strict XFAIL (an unexpected pass fails the run).
    """

    @property
    def name(self) -> str: ...
    @property
    def capabilities(self) -> frozenset[Capability]: ...
    @property
    def expected_failures(self) -> Mapping[str, str]: ...

    def open(self, config: TargetConfig) -> AbstractContextManager[Target]: ...
