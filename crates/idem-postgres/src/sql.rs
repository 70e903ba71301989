//! The statements (`sql/*.sql` at the crate's root), with the schema
//! filled in.

use crate::schema;

/// The statements, with the schema filled in.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) claim: String,
    pub(crate) claim_many: String,
    pub(crate) claim_remembering: String,
    pub(crate) claim_recheck: String,
    pub(crate) purge_remembering: String,
    pub(crate) complete: String,
    pub(crate) complete_many: String,
    pub(crate) complete_pending: String,
    pub(crate) complete_many_pending: String,
    pub(crate) pending_confirm: String,
    pub(crate) pending_take: String,
    pub(crate) pending_take_run: String,
    pub(crate) fail: String,
    pub(crate) extend: String,
    pub(crate) release: String,
    pub(crate) get: String,
    pub(crate) list: String,
    pub(crate) abandoned: String,
    pub(crate) delete: String,
    pub(crate) purge: String,
    pub(crate) state: String,
    pub(crate) wait: String,
    pub(crate) ttl: String,
    pub(crate) step_begin: String,
    pub(crate) step_finish: String,
    pub(crate) steps: String,
    pub(crate) resolve: String,
}

impl Sql {
    pub(crate) fn new(schema_name: &str) -> Self {
        let r = |sql: &str| schema::render(sql, schema_name);
        let claim = |sql: &str| {
            let rules = include_str!("../sql/claim_rules.sql")
                .lines()
                .filter(|l| !l.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            r(&sql.replace("{claim_rules}", &rules))
        };
        Self {
            claim: claim(include_str!("../sql/claim.sql")),
            claim_many: claim(include_str!("../sql/claim_many.sql")),
            claim_remembering: claim(include_str!("../sql/claim_remembering.sql")),
            claim_recheck: r(include_str!("../sql/claim_recheck.sql")),
            purge_remembering: r(include_str!("../sql/purge_remembering.sql")),
            complete: r(include_str!("../sql/complete.sql")),
            complete_many: r(include_str!("../sql/complete_many.sql")),
            complete_pending: r(include_str!("../sql/complete_pending.sql")),
            complete_many_pending: r(include_str!("../sql/complete_many_pending.sql")),
            pending_confirm: r(include_str!("../sql/pending_confirm.sql")),
            pending_take: r(include_str!("../sql/pending_take.sql")),
            pending_take_run: r(include_str!("../sql/pending_take_run.sql")),
            fail: r(include_str!("../sql/fail.sql")),
            extend: r(include_str!("../sql/extend.sql")),
            release: r(include_str!("../sql/release.sql")),
            get: r(include_str!("../sql/get.sql")),
            list: r(include_str!("../sql/list.sql")),
            abandoned: r(include_str!("../sql/abandoned.sql")),
            delete: r(include_str!("../sql/delete.sql")),
            purge: r(include_str!("../sql/purge.sql")),
            ttl: r(include_str!("../sql/ttl.sql")),
            step_begin: r(include_str!("../sql/step_begin.sql")),
            step_finish: r(include_str!("../sql/step_finish.sql")),
            steps: r(include_str!("../sql/steps.sql")),
            resolve: r(include_str!("../sql/resolve.sql")),
            wait: r(include_str!("../sql/wait.sql")),
            state: r("SELECT state FROM {schema}.idem_records WHERE scope = $1 AND key = $2"),
        }
    }
}
