"""The Lua scripts and one typed wrapper per script: ``from dtq import scripts as sc``.

Each script is ``lua/<name>.lua`` (its header lists KEYS, ARGV, the reply and its includes).
:mod:`dtq.scripts.runner` loads and runs them; each other module holds one family's wrappers (a
call builder returning a :class:`Call`, a reply parser, a typed result), shared by the clients,
the admin and the worker.

========================  ==============================================================
``enqueue``               enqueue.lua
``outcomes``              claim, complete, fail, requeue, recover (the hot path)
``reaper``                reclaim, touch, promote
``cancel``                cancel
``admin``                 purge, dlq_requeue, dlq_discard
``flows``                 flow_enqueue, flow_put, flow_apply, flow_cancel, flow_tomb
``schedules``             schedule_put, schedule_fire
``progress``              progress
``retention``             retention_dlq, retention_consumers, retention_queue, retention_keys,
                          retention_hist
``locks``                 lock, unlock
``limits``                limit_sweep
``groups``                group_hold
========================  ==============================================================

:data:`REPLIES` names, per script, the enums of the sentinel values it can answer; a test
(tests/lua/test_record.py) reads every script and fails on a sentinel or error code not named.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from dtq.scripts.admin import (
    DlqVerdict,
    PurgeBatch,
    dlq_discard_call,
    dlq_requeue_call,
    parse_dlq,
    parse_purge,
    purge_call,
)
from dtq.scripts.cancel import CancelOutcome, CancelResult, cancel_call, parse_cancel
from dtq.scripts.enqueue import (
    Enqueued,
    NewTask,
    enqueue_call,
    enqueue_one_call,
    parse_enqueue,
)
from dtq.scripts.flows import (
    Applied,
    Created,
    FlowCancelled,
    FlowEnqueued,
    FlowStatus,
    flow_apply_call,
    flow_cancel_call,
    flow_enqueue_call,
    flow_put_call,
    flow_tomb_call,
    parse_applied,
    parse_created,
    parse_flow_cancel,
    parse_flow_enqueue,
)
from dtq.scripts.groups import Held, group_hold_call, parse_group_hold
from dtq.scripts.limits import SweepResult, limit_sweep_call, parse_limit_sweep
from dtq.scripts.locks import (
    Lock,
    Unlock,
    lock_call,
    parse_lock,
    parse_unlock,
    unlock_call,
)
from dtq.scripts.outcomes import (
    ClaimBatch,
    Claimed,
    ClaimState,
    Failure,
    History,
    RunRef,
    Success,
    Verdict,
    claim_call,
    complete_call,
    fail_call,
    parse_claim,
    parse_complete,
    parse_complete_claim,
    parse_verdicts,
    recover_call,
    requeue_call,
)
from dtq.scripts.progress import Progress, parse_progress, progress_call
from dtq.scripts.reaper import (
    RECLAIM_STEPS,
    PromoteResult,
    PromoteSentinel,
    ReclaimResult,
    TouchMark,
    TouchResult,
    parse_promote,
    parse_reclaim,
    parse_touch,
    promote_call,
    reclaim_call,
    touch_call,
)
from dtq.scripts.retention import (
    DlqPruned,
    KeysSwept,
    QueueState,
    consumer_prune_call,
    hist_fold_call,
    parse_consumer_prune,
    parse_queue_state,
    parse_retention_dlq,
    parse_retention_keys,
    queue_empty_call,
    retention_dlq_call,
    retention_keys_call,
)
from dtq.scripts.runner import (
    REPLY_TTL_MS,
    SCRIPT_NAMES,
    SLOT_GUARD,
    AsyncScripts,
    Call,
    ScriptError,
    SyncScripts,
    hiredis_packing,
    new_nonce,
    source,
    to_str,
    with_slot_guard,
)
from dtq.scripts.schedules import (
    Fired,
    FireOutcome,
    Stored,
    parse_schedule_fire,
    parse_schedule_put,
    schedule_fire_call,
    schedule_put_call,
)

REPLIES: Final[dict[str, tuple[type[Enum], ...]]] = {
    "claim": (ClaimState,),
    "complete": (ClaimState,),
    "recover": (ClaimState,),
    "fail": (Verdict,),
    "requeue": (Verdict,),
    "touch": (TouchMark,),
    "promote": (PromoteSentinel,),
    "cancel": (CancelOutcome,),
    "dlq_requeue": (DlqVerdict,),
    "dlq_discard": (DlqVerdict,),
    "flow_enqueue": (FlowStatus,),
    "flow_cancel": (FlowStatus,),
    "flow_put": (Created,),
    "flow_tomb": (Created,),
    "flow_apply": (Applied,),
    "schedule_put": (Stored,),
    "schedule_fire": (FireOutcome,),
    "progress": (Progress,),
    "group_hold": (Held,),
    "retention_queue": (QueueState,),
    "lock": (Lock,),
    "unlock": (Unlock,),
}
"""Per script, the enums naming every sentinel value it can answer (a string it returns, a
flag, a negative number standing for "none"); scripts that answer only counts and ids have
none."""

__all__ = [
    "RECLAIM_STEPS",
    "REPLIES",
    "REPLY_TTL_MS",
    "SCRIPT_NAMES",
    "SLOT_GUARD",
    "Applied",
    "AsyncScripts",
    "Call",
    "CancelOutcome",
    "CancelResult",
    "ClaimBatch",
    "ClaimState",
    "Claimed",
    "Created",
    "DlqPruned",
    "DlqVerdict",
    "Enqueued",
    "Failure",
    "FireOutcome",
    "Fired",
    "FlowCancelled",
    "FlowEnqueued",
    "FlowStatus",
    "Held",
    "History",
    "KeysSwept",
    "Lock",
    "NewTask",
    "Progress",
    "PromoteResult",
    "PromoteSentinel",
    "PurgeBatch",
    "QueueState",
    "ReclaimResult",
    "RunRef",
    "ScriptError",
    "Stored",
    "Success",
    "SweepResult",
    "SyncScripts",
    "TouchMark",
    "TouchResult",
    "Unlock",
    "Verdict",
    "cancel_call",
    "claim_call",
    "complete_call",
    "consumer_prune_call",
    "dlq_discard_call",
    "dlq_requeue_call",
    "enqueue_call",
    "enqueue_one_call",
    "fail_call",
    "flow_apply_call",
    "flow_cancel_call",
    "flow_enqueue_call",
    "flow_put_call",
    "flow_tomb_call",
    "group_hold_call",
    "hiredis_packing",
    "hist_fold_call",
    "limit_sweep_call",
    "lock_call",
    "new_nonce",
    "parse_applied",
    "parse_cancel",
    "parse_claim",
    "parse_complete",
    "parse_complete_claim",
    "parse_consumer_prune",
    "parse_created",
    "parse_dlq",
    "parse_enqueue",
    "parse_flow_cancel",
    "parse_flow_enqueue",
    "parse_group_hold",
    "parse_limit_sweep",
    "parse_lock",
    "parse_progress",
    "parse_promote",
    "parse_purge",
    "parse_queue_state",
    "parse_reclaim",
    "parse_retention_dlq",
    "parse_retention_keys",
    "parse_schedule_fire",
    "parse_schedule_put",
    "parse_touch",
    "parse_unlock",
    "parse_verdicts",
    "progress_call",
    "promote_call",
    "purge_call",
    "queue_empty_call",
    "reclaim_call",
    "recover_call",
    "requeue_call",
    "retention_dlq_call",
    "retention_keys_call",
    "schedule_fire_call",
    "schedule_put_call",
    "source",
    "to_str",
    "touch_call",
    "unlock_call",
    "with_slot_guard",
]
