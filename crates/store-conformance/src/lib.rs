//! The store conformance suite: what every [`Store`] backend must do, written only
//! against `&dyn Store` so the SQLite store and a later PostgreSQL store run the
//! same cases. A backend's crate runs it from its tests: one test per entry of
//! [`CASES`] on a fresh database, and [`conformance`] on one shared database.
//!
//! It is test code shipped as a library: a failed step panics, failing its case.
//!
//! Each case works in its own tenant (named after the case) and names its
//! supervisors after it too, so the cases can run one after another on one shared
//! database ([`conformance`]) as well as each on a fresh one. "Nothing was
//! written" is checked through the trait alone: a [`Snapshot`] is everything the
//! store shows about a tenant, taken before and after a refused call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admission;
mod events;
mod helpers;
mod idempotency;
mod jobs;
mod messages;
mod nodes;
pub mod pg;
pub mod proxy;
mod recovery;
mod removal;
mod runs;
mod sweepers;
mod tree;

pub use admission::*;
pub use events::*;
pub use helpers::*;
pub use idempotency::*;
pub use jobs::*;
pub use messages::*;
pub use nodes::*;
pub use recovery::*;
pub use removal::*;
pub use runs::*;
pub use sweepers::*;
pub use tree::*;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use brood_core::{
    AgentName, CancelReason, Code, FailReason, Quotas, RunId, SessionName, Status, TenantId,
    Terminal,
};
use brood_store::{
    Agent, Artifact, Channel, ChannelOutput, EndItem, Event, Fence, Message, NewAgent, NewEvent,
    Protocol, Run, RunEnd, StartItem, Store, StoreError, Usage,
};

/// One case of the suite.
pub type Case = fn(&dyn Store);

/// Every case, by name, in the order [`conformance`] runs them.
pub const CASES: &[(&str, Case)] = &[
    (
        "recover_lost_ends_a_lost_nodes_agents_lost",
        recover_lost_ends_a_lost_nodes_agents_lost,
    ),
    (
        "nodes_register_heartbeat_and_show_their_load",
        nodes_register_heartbeat_and_show_their_load,
    ),
    (
        "placed_agents_are_claimed_once_by_their_node",
        placed_agents_are_claimed_once_by_their_node,
    ),
    (
        "inputs_posted_for_a_host_are_taken_once_in_order",
        inputs_posted_for_a_host_are_taken_once_in_order,
    ),
    (
        "blobs_are_kept_in_chunks_and_read_back_whole",
        blobs_are_kept_in_chunks_and_read_back_whole,
    ),
    (
        "slot_shares_count_every_holder_and_hold_under_racing",
        slot_shares_count_every_holder_and_hold_under_racing,
    ),
    (
        "slots_are_taken_and_given_back_many_at_once",
        slots_are_taken_and_given_back_many_at_once,
    ),
    ("admit_root_and_children", admit_root_and_children),
    ("admit_refuses_a_taken_name", admit_refuses_a_taken_name),
    (
        "admit_refuses_a_missing_parent",
        admit_refuses_a_missing_parent,
    ),
    (
        "admit_refuses_a_queued_or_finished_parent",
        admit_refuses_a_queued_or_finished_parent,
    ),
    (
        "admit_refuses_a_stopping_parent",
        admit_refuses_a_stopping_parent,
    ),
    (
        "admit_refuses_a_missing_customer",
        admit_refuses_a_missing_customer,
    ),
    (
        "a_refused_admission_creates_no_tenant",
        a_refused_admission_creates_no_tenant,
    ),
    ("admit_refuses_bad_json", admit_refuses_bad_json),
    (
        "start_run_records_pid_and_cgroup",
        start_run_records_pid_and_cgroup,
    ),
    (
        "start_run_after_cancel_while_queued_is_refused",
        start_run_after_cancel_while_queued_is_refused,
    ),
    (
        "start_run_of_a_stale_run_is_refused",
        start_run_of_a_stale_run_is_refused,
    ),
    (
        "starts_recorded_together_refuse_only_their_own",
        starts_recorded_together_refuse_only_their_own,
    ),
    (
        "writes_answer_the_record_they_leave",
        writes_answer_the_record_they_leave,
    ),
    (
        "a_start_by_a_supervisor_the_record_does_not_name_is_refused",
        a_start_by_a_supervisor_the_record_does_not_name_is_refused,
    ),
    (
        "illegal_transitions_are_refused_and_change_nothing",
        illegal_transitions_are_refused_and_change_nothing,
    ),
    (
        "set_status_blocks_unblocks_and_closes",
        set_status_blocks_unblocks_and_closes,
    ),
    (
        "end_run_records_the_run_and_the_channel_result",
        end_run_records_the_run_and_the_channel_result,
    ),
    (
        "end_run_from_stopping_keeps_the_recorded_outcome",
        end_run_from_stopping_keeps_the_recorded_outcome,
    ),
    (
        "end_run_of_an_old_run_is_refused",
        end_run_of_an_old_run_is_refused,
    ),
    (
        "mark_stopping_records_the_intent",
        mark_stopping_records_the_intent,
    ),
    (
        "mark_stopping_with_an_unknown_name_changes_nothing",
        mark_stopping_with_an_unknown_name_changes_nothing,
    ),
    ("messages_read_back_in_order", messages_read_back_in_order),
    (
        "resume_makes_a_new_run_and_keeps_messages",
        resume_makes_a_new_run_and_keeps_messages,
    ),
    (
        "resume_is_refused_unless_finished",
        resume_is_refused_unless_finished,
    ),
    (
        "resume_is_refused_under_a_dead_parent",
        resume_is_refused_under_a_dead_parent,
    ),
    (
        "resume_within_counts_the_parents_fanout",
        resume_within_counts_the_parents_fanout,
    ),
    (
        "recover_ends_the_dead_supervisors_agents",
        recover_ends_the_dead_supervisors_agents,
    ),
    (
        "recover_resuming_starts_again_what_it_is_asked_to",
        recover_resuming_starts_again_what_it_is_asked_to,
    ),
    (
        "recover_lost_placing_moves_the_queue_and_the_resumable",
        recover_lost_placing_moves_the_queue_and_the_resumable,
    ),
    (
        "record_usage_replaces_the_counters",
        record_usage_replaces_the_counters,
    ),
    (
        "events_filter_by_agent_after_and_limit",
        events_filter_by_agent_after_and_limit,
    ),
    (
        "append_events_refuses_unknown_agents_and_bad_payloads",
        append_events_refuses_unknown_agents_and_bad_payloads,
    ),
    (
        "event_sequences_are_gapless_under_concurrency",
        event_sequences_are_gapless_under_concurrency,
    ),
    ("children_in_creation_order", children_in_creation_order),
    (
        "agents_lists_all_or_unfinished",
        agents_lists_all_or_unfinished,
    ),
    (
        "current_runs_are_the_listed_agents_runs",
        current_runs_are_the_listed_agents_runs,
    ),
    (
        "descendants_are_in_post_order",
        descendants_are_in_post_order,
    ),
    (
        "unfinished_below_names_those_with_an_unfinished_descendant",
        unfinished_below_names_those_with_an_unfinished_descendant,
    ),
    ("spend_rolls_up_the_subtree", spend_rolls_up_the_subtree),
    (
        "lease_epochs_fence_old_holders",
        lease_epochs_fence_old_holders,
    ),
    (
        "overdue_runs_are_found_by_deadline",
        overdue_runs_are_found_by_deadline,
    ),
    (
        "a_childs_deadline_is_never_after_its_parents",
        a_childs_deadline_is_never_after_its_parents,
    ),
    (
        "orphans_have_a_finished_or_missing_parent",
        orphans_have_a_finished_or_missing_parent,
    ),
    (
        "create_limit_is_counted_in_the_admission_transaction",
        create_limit_is_counted_in_the_admission_transaction,
    ),
    (
        "concurrent_admissions_are_exact_and_each_fails_alone",
        concurrent_admissions_are_exact_and_each_fails_alone,
    ),
    (
        "racing_children_keep_create_limit_and_budget",
        racing_children_keep_create_limit_and_budget,
    ),
    (
        "admissions_handed_over_together_are_each_answered_in_order",
        admissions_handed_over_together_are_each_answered_in_order,
    ),
    (
        "idempotent_replies_keep_the_first_answer_until_they_expire",
        idempotent_replies_keep_the_first_answer_until_they_expire,
    ),
    (
        "idempotency_keys_are_the_callers_own",
        idempotency_keys_are_the_callers_own,
    ),
    (
        "jobs_are_created_whole_or_not_at_all",
        jobs_are_created_whole_or_not_at_all,
    ),
    (
        "job_status_follows_its_machine",
        job_status_follows_its_machine,
    ),
    (
        "reports_are_fenced_and_an_item_has_one_result",
        reports_are_fenced_and_an_item_has_one_result,
    ),
    (
        "failures_retry_until_the_attempts_run_out_and_every_attempt_is_kept",
        failures_retry_until_the_attempts_run_out_and_every_attempt_is_kept,
    ),
    (
        "a_finished_tree_is_removed_whole_and_its_names_are_free",
        a_finished_tree_is_removed_whole_and_its_names_are_free,
    ),
    (
        "a_tree_with_a_live_agent_or_an_unfinished_job_is_refused_whole",
        a_tree_with_a_live_agent_or_an_unfinished_job_is_refused_whole,
    ),
    (
        "a_finished_subtree_goes_without_its_parent",
        a_finished_subtree_goes_without_its_parent,
    ),
    (
        "finished_trees_are_listed_oldest_first_past_their_cutoff",
        finished_trees_are_listed_oldest_first_past_their_cutoff,
    ),
    (
        "a_job_goes_with_its_items_attempts_and_own_workers",
        a_job_goes_with_its_items_attempts_and_own_workers,
    ),
];

/// Runs every case on one store, one after another.
pub fn conformance(store: &dyn Store) {
    for (name, case) in CASES {
        eprintln!("conformance: {name}");
        case(store);
    }
}

/// One `#[test]` per case of [`CASES`], for a backend's test file:
/// `conformance_tests!(fresh())` where `fresh()` makes a store on a fresh
/// database and returns `(guard, store)` (the guard keeps the database until
/// the test ends). A failure names its case.
#[macro_export]
macro_rules! conformance_tests {
    ($fresh:expr) => {
        $crate::conformance_tests!(@cases $fresh;
    admit_root_and_children,
    admit_refuses_a_taken_name,
    admit_refuses_a_missing_parent,
    admit_refuses_a_queued_or_finished_parent,
    admit_refuses_a_stopping_parent,
    admit_refuses_a_missing_customer,
    a_refused_admission_creates_no_tenant,
    admit_refuses_bad_json,
    start_run_records_pid_and_cgroup,
    start_run_after_cancel_while_queued_is_refused,
    start_run_of_a_stale_run_is_refused,
    starts_recorded_together_refuse_only_their_own,
    writes_answer_the_record_they_leave,
    a_start_by_a_supervisor_the_record_does_not_name_is_refused,
    illegal_transitions_are_refused_and_change_nothing,
    set_status_blocks_unblocks_and_closes,
    end_run_records_the_run_and_the_channel_result,
    end_run_from_stopping_keeps_the_recorded_outcome,
    end_run_of_an_old_run_is_refused,
    mark_stopping_records_the_intent,
    mark_stopping_with_an_unknown_name_changes_nothing,
    messages_read_back_in_order,
    resume_makes_a_new_run_and_keeps_messages,
    resume_is_refused_unless_finished,
    resume_is_refused_under_a_dead_parent,
    recover_ends_the_dead_supervisors_agents,
    recover_resuming_starts_again_what_it_is_asked_to,
    recover_lost_placing_moves_the_queue_and_the_resumable,
    record_usage_replaces_the_counters,
    events_filter_by_agent_after_and_limit,
    append_events_refuses_unknown_agents_and_bad_payloads,
    event_sequences_are_gapless_under_concurrency,
    children_in_creation_order,
    agents_lists_all_or_unfinished,
    current_runs_are_the_listed_agents_runs,
    spend_rolls_up_the_subtree,
    lease_epochs_fence_old_holders,
    overdue_runs_are_found_by_deadline,
    a_childs_deadline_is_never_after_its_parents,
    orphans_have_a_finished_or_missing_parent,
    descendants_are_in_post_order,
    unfinished_below_names_those_with_an_unfinished_descendant,
    create_limit_is_counted_in_the_admission_transaction,
    concurrent_admissions_are_exact_and_each_fails_alone,
    racing_children_keep_create_limit_and_budget,
    admissions_handed_over_together_are_each_answered_in_order,
    idempotent_replies_keep_the_first_answer_until_they_expire,
    idempotency_keys_are_the_callers_own,
    resume_within_counts_the_parents_fanout,
    jobs_are_created_whole_or_not_at_all,
    job_status_follows_its_machine,
    reports_are_fenced_and_an_item_has_one_result,
    failures_retry_until_the_attempts_run_out_and_every_attempt_is_kept,
    nodes_register_heartbeat_and_show_their_load,
    placed_agents_are_claimed_once_by_their_node,
    inputs_posted_for_a_host_are_taken_once_in_order,
    blobs_are_kept_in_chunks_and_read_back_whole,
    slot_shares_count_every_holder_and_hold_under_racing,
    slots_are_taken_and_given_back_many_at_once,
    recover_lost_ends_a_lost_nodes_agents_lost,
    a_finished_tree_is_removed_whole_and_its_names_are_free,
    a_tree_with_a_live_agent_or_an_unfinished_job_is_refused_whole,
    a_finished_subtree_goes_without_its_parent,
    finished_trees_are_listed_oldest_first_past_their_cutoff,
    a_job_goes_with_its_items_attempts_and_own_workers);
    };
    (@cases $fresh:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let (_keep, store) = $fresh;
                $crate::$case(&store);
            }
        )*

        /// The list above and the suite's own list must not drift apart.
        #[test]
        fn every_conformance_case_has_a_test() {
            let here = [$(stringify!($case)),*];
            for (case, _) in $crate::CASES {
                assert!(here.contains(case), "conformance case {case} has no test in the macro's list");
            }
        }
    };
}
