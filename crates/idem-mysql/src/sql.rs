//! The statements (`sql/*.sql` at the crate's root) and the procedure
//! calls, as the store runs them.

/// The statements, with the record's columns filled in.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) complete: String,
    pub(crate) fail: String,
    pub(crate) release: String,
    pub(crate) get: String,
    pub(crate) list: String,
    pub(crate) abandoned: String,
    pub(crate) delete_live: String,
    pub(crate) delete: String,
    pub(crate) purge: String,
    pub(crate) purge_take: String,
    pub(crate) held_locked: String,
    pub(crate) ttl: String,
    pub(crate) steps: String,
    pub(crate) state: String,
}

/// The procedures (`migrations/0004_procedures.sql`), as calls.
pub(crate) const CLAIM: &str = "CALL idem_claim(?, ?, ?, ?, ?, ?)";
pub(crate) const CLAIM_MANY: &str = "CALL idem_claim_many(?)";
/// One claim inside the caller's transaction (its answer in the
/// session's `idem_answers`, made by `idem_answers_ready`).
pub(crate) const CLAIM_ROW: &str = "CALL idem_claim_row(1, ?, ?, ?, ?, ?, ?)";
pub(crate) const COMPLETE_MANY: &str = "CALL idem_complete_many(?)";
pub(crate) const EXTEND: &str = "CALL idem_extend(?, ?, ?, ?)";
pub(crate) const STEP_BEGIN: &str = "CALL idem_step_begin(?, ?, ?, ?, ?)";
pub(crate) const STEP_FINISH: &str = "CALL idem_step_finish(?, ?, ?, ?, ?)";
pub(crate) const RESOLVE: &str = "CALL idem_resolve(?, ?, ?, ?, ?)";

/// A statement file without its comment lines.
pub(crate) fn text(sql: &str) -> String {
    sql.lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Sql {
    pub(crate) fn new() -> Self {
        let record = text(include_str!("../sql/record.sql"));
        let r = |sql: &str| text(sql).replace("{record}", &record);
        Self {
            complete: r(include_str!("../sql/complete.sql")),
            fail: r(include_str!("../sql/fail.sql")),
            release: r(include_str!("../sql/release.sql")),
            get: r(include_str!("../sql/get.sql")),
            list: r(include_str!("../sql/list.sql")),
            abandoned: r(include_str!("../sql/abandoned.sql")),
            delete_live: r(include_str!("../sql/delete_live.sql")),
            delete: r(include_str!("../sql/delete.sql")),
            purge: r(include_str!("../sql/purge.sql")),
            purge_take: r(include_str!("../sql/purge_take.sql")),
            held_locked: r(include_str!("../sql/held_locked.sql")),
            ttl: r(include_str!("../sql/ttl.sql")),
            steps: r(include_str!("../sql/steps.sql")),
            state: r(include_str!("../sql/state.sql")),
        }
    }
}
