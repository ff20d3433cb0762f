//! The PostgreSQL store against the conformance suite (issue 15 item 1),
//! on the real server: `BROOD_TEST_POSTGRES` (an administrator's connection
//! string; default `postgres://root:brood@127.0.0.1:5432/postgres`, which
//! `.ci/setup` makes answer). Every test makes a database of its own and
//! drops it when it ends, passed or failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use brood_store::postgres::PgStore;
use brood_store_conformance as conformance;

use conformance::pg::Fresh;

fn fresh() -> (Fresh, PgStore) {
    let db = Fresh::new();
    let store = PgStore::open(&db.url).unwrap();
    (db, store)
}

// One test per conformance case, each on a fresh database, so a failure
// names its case.
macro_rules! conformance_tests {
    ($($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let (_db, store) = fresh();
                conformance::$case(&store);
            }
        )*

        /// The list above and the suite's own list must not drift apart.
        #[test]
        fn every_conformance_case_has_a_test() {
            let here = [$(stringify!($case)),*];
            for (case, _) in conformance::CASES {
                assert!(here.contains(case), "conformance case {case} has no test in postgres.rs");
            }
        }
    };
}

conformance_tests!(
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
    record_usage_replaces_the_counters,
    events_filter_by_agent_after_and_limit,
    append_events_refuses_unknown_agents_and_bad_payloads,
    event_sequences_are_gapless_under_concurrency,
    children_in_creation_order,
    agents_lists_all_or_unfinished,
    spend_rolls_up_the_subtree,
    lease_epochs_fence_old_holders,
    overdue_runs_are_found_by_deadline,
    orphans_have_a_finished_or_missing_parent,
    descendants_are_in_post_order,
    create_limit_is_counted_in_the_admission_transaction,
    idempotent_replies_keep_the_first_answer_until_they_expire,
    resume_within_counts_the_parents_fanout,
    jobs_are_created_whole_or_not_at_all,
    job_status_follows_its_machine,
    reports_are_fenced_and_an_item_has_one_result,
    failures_retry_until_the_attempts_run_out_and_every_attempt_is_kept,
    nodes_register_heartbeat_and_show_their_load,
    recover_lost_ends_a_lost_nodes_agents_lost,
);

#[test]
fn the_whole_suite_runs_on_one_shared_database() {
    let (_db, store) = fresh();
    conformance::conformance(&store);
}

#[test]
fn opening_twice_migrates_once_and_a_bad_url_is_named() {
    let (db, store) = fresh();
    drop(store);
    let again = PgStore::open(&db.url).unwrap();
    assert!(again.target().ends_with(&db.name), "{}", again.target());
    let e = PgStore::open("postgres://root:secret@127.0.0.1:1/nowhere")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("127.0.0.1:1/nowhere") && !e.contains("secret"),
        "{e}"
    );
    let e = PgStore::open("not a url at all").unwrap_err().to_string();
    assert!(e.contains("not a PostgreSQL connection string"), "{e}");
}

/// The sweepers' lease lock across nodes: one holder among every store on
/// the server; another node can break it (a holder declared lost), after
/// which the old holder knows it lost it and another takes it.
#[test]
fn the_lease_lock_has_one_holder_across_stores_and_can_be_broken() {
    use brood_store::{LeaseLock, Sweeps};
    let (db, a) = fresh();
    let b = PgStore::open(&db.url).unwrap();
    let held = match a.lease_lock("sweepers").unwrap() {
        LeaseLock::Held(h) => h,
        _ => panic!("the first store takes the lock"),
    };
    assert!(held.is_held());
    assert!(matches!(
        b.lease_lock("sweepers").unwrap(),
        LeaseLock::Taken
    ));
    // Another lease's lock is another lock.
    assert!(matches!(b.lease_lock("other").unwrap(), LeaseLock::Held(_)));
    assert!(b.break_lease_lock("sweepers").unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while held.is_held() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!held.is_held(), "the broken holder sees it lost the lock");
    assert!(matches!(
        b.lease_lock("sweepers").unwrap(),
        LeaseLock::Held(_)
    ));
    assert!(!a.break_lease_lock("nobody-holds-this").unwrap());
}
