"""graft.Runtime: one rank's runtime, mirroring include/graft/graft.h."""
import collections
import queue
import threading

from graft._lib import QUORUM_BLOB_MAX, ffi, lib, string, take_string
from graft.errors import SpareUnused, UsageError, check, error_for

KINDS = {"param": 1, "optim": 2, "rng": 3, "sched": 4, "data": 5, "scaler": 6,
         "step": 7, "blob": 8}

# The trainer's dtype codes (part of the layout hash): the same dtype gets
# the same code in every group.
DTYPES = {"float32": 1, "float64": 2, "float16": 3, "bfloat16": 4, "int64": 5,
          "int32": 6, "int16": 7, "int8": 8, "uint8": 9, "bool": 10,
          "complex64": 11, "complex128": 12, "uint16": 13, "uint32": 14,
          "uint64": 15}

START_KINDS = {0: "undecided", 1: "cold", 2: "peer", 3: "restore"}

StepInfo = collections.namedtuple(
    "StepInfo", "step quorum_id quorum_changed replica_rank replica_world healing "
    "donor n_recipients round")

Event = collections.namedtuple(
    "Event", "kind status status_name step quorum_id bytes detect_ns quorum_ns "
    "transfer_ns verify_ns n_donors detail")

METRIC_FIELDS = [f for f, _ in ffi.typeof("graft_metrics_t").fields]


DEVICE_HOST, DEVICE_CUDA = 0, 1  # graft_device_t


def _memory(obj):
    """(address, bytes, dtype name, owner, graft device) of a contiguous host
    array, host tensor or CUDA tensor."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        if obj.device.type not in ("cpu", "cuda"):
            raise UsageError(-2, "graft: only CPU and CUDA tensors can be registered "
                             "(this one is on %s)" % obj.device)
        if not obj.is_contiguous():
            raise UsageError(-1, "graft: the tensor is not contiguous; register "
                             "t.contiguous() kept alive by the caller")
        nbytes = obj.numel() * obj.element_size()
        device = DEVICE_CUDA if obj.device.type == "cuda" else DEVICE_HOST
        return obj.data_ptr(), nbytes, str(obj.dtype).replace("torch.", ""), obj, device
    if mod.startswith("numpy") and hasattr(obj, "__array_interface__"):
        if not obj.flags["C_CONTIGUOUS"]:
            raise UsageError(-1, "graft: the array is not C-contiguous; register "
                             "np.ascontiguousarray(a) kept alive by the caller")
        if not obj.flags["WRITEABLE"]:
            raise UsageError(-1, "graft: the array is read-only; a heal writes into it")
        return obj.ctypes.data, obj.nbytes, obj.dtype.name, obj, DEVICE_HOST
    raise UsageError(-1, "graft: register takes a numpy array or a CPU or CUDA torch tensor, "
                     "not %s" % type(obj).__name__)


def _setting(cfg, name):
    """A configuration's setting as text (for error messages)."""
    out = ffi.new("char **")
    if lib.graft_config_get(cfg, name.encode(), out) != 0:
        return "?"
    return take_string(out)


class Runtime:
    """One rank's runtime.

    Settings come from the ``GRAFT_*`` environment variables (unless
    ``env=False``), then from keyword arguments, which win; the names are
    those of graft.h's settings table (``job``, ``group``, ``groups``,
    ``etcd_endpoints``, ``persist_root``, ...). Use it as a context manager
    or call close().

    ``group``, ``groups``, ``rank`` and ``ranks_per_group`` are attributes
    once it is created. Under torchrun (a group of many ranks), pass
    ``**graft.launcher_settings()``: the rank and group size come from
    ``RANK`` / ``WORLD_SIZE``, the group from ``GRAFT_GROUP`` or
    ``REPLICA_GROUP_ID``.

    ``spare=True`` (or ``GRAFT_SPARE=1``) makes the process a spare of rank
    ``rank`` (docs/RUNTIME.md, "Spares"; ``group`` is not needed): it
    registers its regions as usual, and its first quorum() waits until it
    took the slot of a dead rank ``rank`` of some group, then returns as a
    replacement's first quorum does (it heals from donors). ``group`` is
    None until then and the slot's group after; ``promoted`` says which.
    When every group ended the job cleanly first, that quorum() raises
    graft.SpareUnused (``finished`` is then True): nothing to do, exit 0.
    ``spare_follow=True`` (or ``GRAFT_SPARE_FOLLOW=1``) makes the spare a
    follower ("Follow spares"): while it waits it pulls each step's state,
    so a promotion at the step it holds pulls nothing.
    """

    def __init__(self, env=True, **settings):
        self._rt = ffi.NULL
        self._group = None
        self.groups = self.rank = self.ranks_per_group = None
        self.spare = False
        self.restarted = False   # restart() abandoned the open step
        self.restarts = 0
        self._regions = {}       # name -> the object whose memory is the region
        self._names = []         # keeps the C strings alive
        self.region_table = []   # (name, kind, dtype, bytes) in registration order
        self._events = queue.Queue()
        self._event_fn = None
        self._event_lock = threading.Lock()
        # What this rank knows of the open step (see participating).
        self._info = None
        self._heal_pending = False
        self.heal_error = None
        cfg_p = ffi.new("graft_config_t **")
        check(lib.graft_config_create(cfg_p), "graft: cannot create a configuration")
        cfg = cfg_p[0]
        err = ffi.new("char **")
        try:
            if env:
                st = lib.graft_config_from_env(cfg, err)
                if st != 0:
                    raise error_for(st, "graft: " + (take_string(err) or "bad GRAFT_* variable"))
            for name, value in settings.items():
                if value is None:
                    continue
                if isinstance(value, bool):
                    value = "1" if value else "0"
                elif isinstance(value, (list, tuple)):
                    value = ",".join(str(v) for v in value)
                st = lib.graft_config_set(cfg, name.encode(), str(value).encode(), err)
                if st != 0:
                    raise error_for(st, "graft: setting %s=%r: %s"
                                    % (name, value, take_string(err) or "refused"))
            st = lib.graft_config_validate(cfg, err)
            if st != 0:
                raise error_for(st, "graft: " + (take_string(err) or "invalid configuration"))
            rt_p = ffi.new("graft_runtime_t **")
            self.etcd_endpoints = _setting(cfg, "etcd_endpoints")
            # strict: a step commits only with every group (bit-exact after
            # a failure); elastic: with min_groups of them.
            self.mode = _setting(cfg, "mode")
            # Where this process sits: its group and its rank in it (a
            # group of many ranks is a launcher's world, see launcher.py).
            for name in ("groups", "rank", "ranks_per_group"):
                text = _setting(cfg, name)
                setattr(self, name, int(text) if text.isdigit() else None)
            # A spare's group is the slot it takes at its first quorum.
            self.spare = _setting(cfg, "spare") == "1"
            text = _setting(cfg, "group")
            self._group = int(text) if text.isdigit() and not self.spare else None
            st = lib.graft_init(cfg, rt_p)
            if st != 0:
                raise error_for(st, "graft: graft_init failed (etcd_endpoints %s, "
                                "etcd_connect_timeout_ms %s)"
                                % (self.etcd_endpoints,
                                   _setting(cfg, "etcd_connect_timeout_ms")))
            self._rt = rt_p[0]
        finally:
            lib.graft_config_destroy(cfg)
        # Every event lands in the iterator's queue and goes to the Python
        # callback, if one is set; the C callback must stay referenced.
        self._c_event = ffi.callback("void(const graft_runtime_event_t *, void *)",
                                     self._on_event)
        lib.graft_event_callback_set(self._rt, self._c_event, ffi.NULL)

    # -- life cycle -------------------------------------------------------

    def close(self):
        """Leave the job and free the runtime (waits for checkpoint work)."""
        if self._rt != ffi.NULL:
            rt, self._rt = self._rt, ffi.NULL
            lib.graft_destroy(rt)
        self._regions.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _h(self):
        if self._rt == ffi.NULL:
            raise UsageError(-3, "graft: the runtime is closed")
        return self._rt

    # -- regions ----------------------------------------------------------

    def register(self, name, obj, kind="param", dtype=None, global_offset=0, global_bytes=0):
        """Register a numpy array or CPU torch tensor as a region, zero-copy:
        the region is the object's own memory, and the runtime keeps a
        reference so it cannot be freed. Only before the first quorum()."""
        rt = self._h()
        if not isinstance(name, str) or not name:
            raise UsageError(-1, "graft: a region name is a non-empty str, not %r" % (name,))
        if isinstance(kind, str):
            if kind not in KINDS:
                raise UsageError(-1, "graft: unknown region kind %r (one of %s)"
                                 % (kind, ", ".join(KINDS)))
            kind = KINDS[kind]
        addr, nbytes, dname, owner, device = _memory(obj)
        if nbytes == 0:
            raise UsageError(-1, "graft: region %r is empty" % name)
        cname = ffi.new("char[]", name.encode())
        reg = ffi.new("graft_region_t *")
        reg.name = cname
        reg.kind = kind
        reg.dtype = dtype if dtype is not None else DTYPES.get(dname, 0)
        reg.device = device
        reg.ptr = ffi.cast("void *", addr)
        reg.bytes = nbytes
        reg.global_offset = global_offset
        reg.global_bytes = global_bytes
        check(lib.graft_region_register(rt, reg), "graft: cannot register region %r" % name)
        self._regions[name] = owner
        self._names.append(cname)
        self.region_table.append((name, int(reg.kind), int(reg.dtype), int(nbytes)))

    @property
    def regions(self):
        """Registered regions by name (the objects whose memory they are)."""
        return dict(self._regions)

    # -- the step protocol ------------------------------------------------

    def quorum(self):
        """Start of a step: wait for a quorum. Returns a StepInfo."""
        info = ffi.new("graft_step_info_t *")
        self._info = None
        self.heal_error = None
        self.restarted = False
        st = lib.graft_quorum(self._h(), info)
        if st == _ECANCELED and self.spare and self._group is None and \
                lib.graft_finished(self._rt):
            raise SpareUnused(st, "graft: spare of rank %s: every group ended the job without "
                              "needing it" % self.rank)
        if st in _ETCD_DOWN:
            raise error_for(st, "graft: quorum failed (etcd_endpoints %s)" % self.etcd_endpoints)
        check(st, "graft: quorum failed")
        # Read here, on the training thread: a spare has its group now.
        group = lib.graft_group(self._rt)
        self._group = None if group == _NO_GROUP else int(group)
        si = StepInfo(info.step, info.quorum_id, bool(info.quorum_changed),
                      info.replica_rank, info.replica_world, bool(info.healing),
                      bool(info.donor), info.n_recipients, info.round)
        self._info = si
        self._heal_pending = si.healing
        return si

    def heal_wait(self):
        """Wait for the background heal, if any; raises when it failed (the
        next commit() then says no)."""
        try:
            check(lib.graft_heal_wait(self._h()), "graft: heal failed")
        except Exception as e:
            self.heal_error = e
            raise
        self._heal_pending = False

    @property
    def participating(self):
        """Whether this rank holds the open step's state, so what it computes
        from it may enter a cross-group reduction: a quorum is open, no heal
        is pending (heal_wait() not called yet) or failed, and the rank's
        committed step is the quorum's. A non-participant contributes zero
        to GradientAverager's reduction and its commit says no."""
        info = self._info
        return (info is not None and self._rt != ffi.NULL and not self._heal_pending
                and self.heal_error is None and lib.graft_step(self._rt) == info.step)

    def commit(self):
        """End of a step: the vote. True: apply the optimizer step now.
        False without a vote when restart() abandoned the step."""
        if self.restarted:
            self.restarted = False
            self._info = None
            return False
        apply_p = ffi.new("bool *")
        try:
            check(lib.graft_commit(self._h(), apply_p), "graft: commit failed")
        finally:
            self._info = None
        return bool(apply_p[0])

    def restart(self):
        """Restart this rank in place, without exiting (graft_restart(),
        docs/RUNTIME.md "In-place restart"): for a failure the process
        survived but its communication did not (a collective that failed or
        timed out). The open step is abandoned: the next commit() returns
        False without a vote, and the trainer must not apply the step. The
        next quorum() joins as a new incarnation, keeping the committed state
        (pulled when the job moved on)."""
        check(lib.graft_restart(self._h()), "graft: restart in place failed")
        self._info = None
        self.restarted = True
        self.restarts += 1

    def veto(self):
        """Make this rank's vote at the coming commit() a no (a failure the
        runtime cannot see, such as a failed cross-group collective)."""
        check(lib.graft_commit_veto(self._h()), "graft: cannot veto the step")

    @property
    def group(self):
        """This process's replica group: the configured one, or for a spare
        the group whose slot it took at its first quorum() (None before)."""
        return self._group

    @property
    def promoted(self):
        """Whether this is a spare that took a slot (its first quorum()
        returned)."""
        return self.spare and self._group is not None

    @property
    def step(self):
        return lib.graft_step(self._h())

    @property
    def quorum_id(self):
        return lib.graft_quorum_id(self._h())

    @property
    def replica_rank(self):
        return lib.graft_replica_rank(self._h())

    @property
    def replica_world(self):
        return lib.graft_replica_world(self._h())

    @property
    def start_kind(self):
        """'undecided', 'cold', 'peer' or 'restore'."""
        return START_KINDS.get(lib.graft_start_kind(self._h()), "unknown")

    # -- the per-quorum blob ----------------------------------------------

    def blob_publish(self, data):
        """Publish bytes for the latest quorum id; False when another rank
        published first (read it with blob_get())."""
        data = bytes(data)
        st = lib.graft_quorum_blob_publish(self._h(), data, len(data))
        if st == _EEXIST:
            return False
        check(st, "graft: cannot publish the quorum blob")
        return True

    def blob_get(self, quorum_id=None, timeout_ms=30000):
        """The blob published for a quorum id (default: the latest)."""
        qid = self.quorum_id if quorum_id is None else quorum_id
        buf = ffi.new("char[]", QUORUM_BLOB_MAX)
        n = ffi.new("size_t *")
        check(lib.graft_quorum_blob_get(self._h(), qid, timeout_ms, buf, QUORUM_BLOB_MAX, n),
              "graft: no quorum blob for quorum %d" % qid)
        return ffi.buffer(buf, n[0])[:]

    # -- persistent tier --------------------------------------------------

    def finish(self):
        """End the job cleanly from inside an open step (after quorum() and
        heal_wait(), instead of training it): the step is committed without
        being applied and, with persist_root set and persist_final on (the
        default), its checkpoint is written (unless one of that step is on
        disk) and waited for, so the final state is on disk. Every rank of
        every group calls it at the same step. Returns whether this group
        committed the closing step (graft_finished()); on False the trainer
        opens the step again (quorum()) and calls finish() again. Groups that
        ended are not waited for by the others (docs/RUNTIME.md, "A clean
        end: the closing step")."""
        check(lib.graft_finish(self._h()), "graft: cannot finish here")
        self.commit()
        return self.finished

    @property
    def finished(self):
        """Whether this rank committed a closing step (finish())."""
        return bool(lib.graft_finished(self._h()))

    def checkpoint_now(self):
        """Write a checkpoint of the committed step now (blocks until durable)."""
        check(lib.graft_checkpoint_now(self._h()), "graft: checkpoint failed")

    def checkpoint_wait(self):
        """Wait for the background part of the last checkpoint."""
        check(lib.graft_checkpoint_wait(self._h()), "graft: checkpoint failed")

    # -- observability ----------------------------------------------------

    def metrics(self):
        """The runtime's counters and durations (ns) as a dict."""
        m = ffi.new("graft_metrics_t *")
        lib.graft_metrics_get(self._h(), m)
        return {f: getattr(m, f) for f in METRIC_FIELDS}

    def on_event(self, fn):
        """Call fn(Event) for every runtime event (None to stop). It runs on
        the training thread or the runtime's checkpoint thread and must not
        call back into the runtime."""
        with self._event_lock:
            self._event_fn = fn

    def events(self, timeout=0.0):
        """Iterate over the events received so far; with a timeout, wait that
        long for the next one before stopping."""
        while True:
            try:
                yield self._events.get(timeout=timeout) if timeout else self._events.get_nowait()
            except queue.Empty:
                return

    def _on_event(self, ev, _arg):
        try:
            e = Event(string(lib.graft_runtime_event_kind_string(ev.kind)), ev.status,
                      string(lib.graft_status_name(ev.status)), ev.step, ev.quorum_id,
                      ev.bytes, ev.detect_ns, ev.quorum_ns, ev.transfer_ns, ev.verify_ns,
                      ev.n_donors, string(ev.detail))
            self._events.put(e)
            with self._event_lock:
                fn = self._event_fn
            if fn is not None:
                fn(e)
        except Exception:  # an exception must not unwind into C
            import traceback

            traceback.print_exc()


# graft_quorum_blob_publish's "already published" (GRAFT_EEXIST); codes are
# append-only in common.h's status table.
_EEXIST = -4
# graft_quorum's "the job ended without this spare" (GRAFT_ECANCELED).
_ECANCELED = -6
# graft_group() of a spare not promoted yet.
_NO_GROUP = 0xFFFFFFFF
# GRAFT_EUNREACHABLE and GRAFT_EETCD_TIMEOUT: errors that name the endpoints.
_ETCD_DOWN = (-500, -501)


def version():
    """libgraft's version string."""
    return string(lib.graft_version())


LOG_LEVELS = ["off", "error", "warn", "info", "debug", "trace"]
_log_cb = None


def set_log_level(name):
    """The library's log threshold ("off" .. "trace")."""
    if name not in LOG_LEVELS:
        raise UsageError(-1, "graft: unknown log level %r (one of %s)"
                         % (name, ", ".join(LOG_LEVELS)))
    lib.graft_log_level_set(LOG_LEVELS.index(name))


def set_log_callback(fn):
    """Route the library's log messages to fn(level_name, module, message)
    (None: back to standard error). It may run on any of the library's
    threads and must not call into the runtime."""
    global _log_cb
    if fn is None:
        lib.graft_log_callback_set(ffi.NULL, ffi.NULL)
        _log_cb = None
        return

    def sink(level, module, message, _arg):
        try:
            fn(LOG_LEVELS[level] if 0 <= level < len(LOG_LEVELS) else str(level),
               string(module), string(message))
        except Exception:
            import traceback

            traceback.print_exc()

    cb = ffi.callback("void(int, const char *, const char *, void *)", sink)
    lib.graft_log_callback_set(cb, ffi.NULL)
    _log_cb = cb  # the C side holds it: keep it alive
