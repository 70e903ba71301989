//! The pgbench scripts the PostgreSQL benchmarks compare against: the
//! store's own statements, prepared, with parameters from pgbench
//! variables.

use idem_postgres::PgStore;
use idem_testkit::servers::postgres::pgbench_command;

/// A pgbench script of one run: claim, `steps` begin/finish pairs,
/// complete.
pub(crate) fn run(store: &PgStore, steps: usize) -> String {
    let key = "('k' || :client_id::text || '-' || :n::text)";
    let token = "(int8send(:t::bigint) || int8send(:n::bigint))";
    let mut script =
        String::from("\\set n random(1, 1000000000000)\n\\set t random(1, 1000000000000)\n");
    script.push_str(&pgbench_command(
        store.claim_sql(),
        &[
            ("$1", "'bench'"),
            ("$2", key),
            ("$3", "NULL::bytea"),
            ("$4", token),
            ("$5", "30000"),
            ("$6", "3600000"),
        ],
    ));
    for step in 0..steps {
        let name = format!("'s{step}'");
        script.push_str(&pgbench_command(
            store.step_begin_sql(),
            &[
                ("$1", "'bench'"),
                ("$2", key),
                ("$3", token),
                ("$4", &name),
                ("$5", "1"),
            ],
        ));
        script.push_str(&pgbench_command(
            store.step_finish_sql(),
            &[
                ("$1", "'bench'"),
                ("$2", key),
                ("$3", token),
                ("$4", &name),
                ("$5", "'\\x31'::bytea"),
            ],
        ));
    }
    script.push_str(&pgbench_command(
        store.complete_sql(),
        &[
            ("$1", "'bench'"),
            ("$2", key),
            ("$3", token),
            ("$4", "'\\x7b7d'::bytea"),
            ("$5", "3600000"),
        ],
    ));
    script
}
