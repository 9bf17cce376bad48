"""The Lua scripts and one typed wrapper per script: ``from dtq import scripts as sc``.

:mod:`dtq.scripts.runner` loads and runs ``lua/<name>.lua``; each other module holds one
family's wrappers (a call builder returning a :class:`Call`, a reply parser, a typed result):
which family is where is in docs/design.md, "Module map".
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from dtq.scripts.admin import DlqVerdict as DlqVerdict
from dtq.scripts.admin import PurgeBatch as PurgeBatch
from dtq.scripts.admin import dlq_discard_call as dlq_discard_call
from dtq.scripts.admin import dlq_requeue_call as dlq_requeue_call
from dtq.scripts.admin import parse_dlq as parse_dlq
from dtq.scripts.admin import parse_purge as parse_purge
from dtq.scripts.admin import purge_call as purge_call
from dtq.scripts.cancel import CancelOutcome as CancelOutcome
from dtq.scripts.cancel import CancelResult as CancelResult
from dtq.scripts.cancel import cancel_call as cancel_call
from dtq.scripts.cancel import parse_cancel as parse_cancel
from dtq.scripts.enqueue import Enqueued as Enqueued
from dtq.scripts.enqueue import NewTask as NewTask
from dtq.scripts.enqueue import enqueue_call as enqueue_call
from dtq.scripts.enqueue import enqueue_one_call as enqueue_one_call
from dtq.scripts.enqueue import parse_enqueue as parse_enqueue
from dtq.scripts.flows import Applied as Applied
from dtq.scripts.flows import Created as Created
from dtq.scripts.flows import FlowCancelled as FlowCancelled
from dtq.scripts.flows import FlowEnqueued as FlowEnqueued
from dtq.scripts.flows import FlowStatus as FlowStatus
from dtq.scripts.flows import flow_apply_call as flow_apply_call
from dtq.scripts.flows import flow_cancel_call as flow_cancel_call
from dtq.scripts.flows import flow_enqueue_call as flow_enqueue_call
from dtq.scripts.flows import flow_put_call as flow_put_call
from dtq.scripts.flows import flow_tomb_call as flow_tomb_call
from dtq.scripts.flows import parse_applied as parse_applied
from dtq.scripts.flows import parse_created as parse_created
from dtq.scripts.flows import parse_flow_cancel as parse_flow_cancel
from dtq.scripts.flows import parse_flow_enqueue as parse_flow_enqueue
from dtq.scripts.groups import Held as Held
from dtq.scripts.groups import group_hold_call as group_hold_call
from dtq.scripts.groups import parse_group_hold as parse_group_hold
from dtq.scripts.limits import SweepResult as SweepResult
from dtq.scripts.limits import limit_sweep_call as limit_sweep_call
from dtq.scripts.limits import parse_limit_sweep as parse_limit_sweep
from dtq.scripts.locks import Lock as Lock
from dtq.scripts.locks import Unlock as Unlock
from dtq.scripts.locks import lock_call as lock_call
from dtq.scripts.locks import parse_lock as parse_lock
from dtq.scripts.locks import parse_unlock as parse_unlock
from dtq.scripts.locks import unlock_call as unlock_call
from dtq.scripts.outcomes import ClaimBatch as ClaimBatch
from dtq.scripts.outcomes import Claimed as Claimed
from dtq.scripts.outcomes import ClaimState as ClaimState
from dtq.scripts.outcomes import Failure as Failure
from dtq.scripts.outcomes import History as History
from dtq.scripts.outcomes import RunRef as RunRef
from dtq.scripts.outcomes import Success as Success
from dtq.scripts.outcomes import Verdict as Verdict
from dtq.scripts.outcomes import claim_call as claim_call
from dtq.scripts.outcomes import complete_call as complete_call
from dtq.scripts.outcomes import fail_call as fail_call
from dtq.scripts.outcomes import parse_claim as parse_claim
from dtq.scripts.outcomes import parse_complete as parse_complete
from dtq.scripts.outcomes import parse_complete_claim as parse_complete_claim
from dtq.scripts.outcomes import parse_verdicts as parse_verdicts
from dtq.scripts.outcomes import recover_call as recover_call
from dtq.scripts.outcomes import requeue_call as requeue_call
from dtq.scripts.progress import Progress as Progress
from dtq.scripts.progress import parse_progress as parse_progress
from dtq.scripts.progress import progress_call as progress_call
from dtq.scripts.reaper import RECLAIM_STEPS as RECLAIM_STEPS
from dtq.scripts.reaper import PromoteResult as PromoteResult
from dtq.scripts.reaper import PromoteSentinel as PromoteSentinel
from dtq.scripts.reaper import ReclaimResult as ReclaimResult
from dtq.scripts.reaper import TouchMark as TouchMark
from dtq.scripts.reaper import TouchResult as TouchResult
from dtq.scripts.reaper import parse_promote as parse_promote
from dtq.scripts.reaper import parse_reclaim as parse_reclaim
from dtq.scripts.reaper import parse_touch as parse_touch
from dtq.scripts.reaper import promote_call as promote_call
from dtq.scripts.reaper import reclaim_call as reclaim_call
from dtq.scripts.reaper import touch_call as touch_call
from dtq.scripts.retention import DlqPruned as DlqPruned
from dtq.scripts.retention import KeysSwept as KeysSwept
from dtq.scripts.retention import QueueState as QueueState
from dtq.scripts.retention import consumer_prune_call as consumer_prune_call
from dtq.scripts.retention import hist_fold_call as hist_fold_call
from dtq.scripts.retention import parse_consumer_prune as parse_consumer_prune
from dtq.scripts.retention import parse_queue_state as parse_queue_state
from dtq.scripts.retention import parse_retention_dlq as parse_retention_dlq
from dtq.scripts.retention import parse_retention_keys as parse_retention_keys
from dtq.scripts.retention import queue_empty_call as queue_empty_call
from dtq.scripts.retention import retention_dlq_call as retention_dlq_call
from dtq.scripts.retention import retention_keys_call as retention_keys_call
from dtq.scripts.runner import REPLY_TTL_MS as REPLY_TTL_MS
from dtq.scripts.runner import SCRIPT_NAMES as SCRIPT_NAMES
from dtq.scripts.runner import SLOT_GUARD as SLOT_GUARD
from dtq.scripts.runner import AsyncScripts as AsyncScripts
from dtq.scripts.runner import Call as Call
from dtq.scripts.runner import ScriptError as ScriptError
from dtq.scripts.runner import SyncScripts as SyncScripts
from dtq.scripts.runner import hiredis_packing as hiredis_packing
from dtq.scripts.runner import new_nonce as new_nonce
from dtq.scripts.runner import source as source
from dtq.scripts.runner import to_str as to_str
from dtq.scripts.runner import with_slot_guard as with_slot_guard
from dtq.scripts.schedules import Fired as Fired
from dtq.scripts.schedules import FireOutcome as FireOutcome
from dtq.scripts.schedules import Stored as Stored
from dtq.scripts.schedules import parse_schedule_fire as parse_schedule_fire
from dtq.scripts.schedules import parse_schedule_put as parse_schedule_put
from dtq.scripts.schedules import schedule_fire_call as schedule_fire_call
from dtq.scripts.schedules import schedule_put_call as schedule_put_call

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
