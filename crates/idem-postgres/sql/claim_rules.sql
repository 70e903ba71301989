-- The claim's rules for a key that already has a row, shared by
-- sql/claim.sql and sql/claim_many.sql (filled in for `{claim_rules}`):
-- the row is taken only if it is expired (a new record: attempt 1, the
-- new fingerprint), released, or in progress past its lease (a takeover),
-- with the same fingerprint. Otherwise nothing is written (the row is
-- still locked).
    ON CONFLICT (scope, key) DO UPDATE SET
        state = 'in_progress',
        token = excluded.token,
        lease_until = excluded.lease_until,
        fence = excluded.fence,
        response = NULL,
        failure_class = NULL,
        failure_message = NULL,
        updated_at = excluded.updated_at,
        takeover = (r.expires_at > now() AND r.state = 'in_progress'),
        fingerprint = CASE WHEN r.expires_at <= now() THEN excluded.fingerprint ELSE r.fingerprint END,
        attempt = CASE WHEN r.expires_at <= now() THEN 1 ELSE r.attempt + 1 END,
        created_at = CASE WHEN r.expires_at <= now() THEN excluded.created_at ELSE r.created_at END,
        expires_at = CASE WHEN r.expires_at <= now() THEN excluded.expires_at
                          ELSE greatest(r.expires_at, excluded.expires_at) END
    WHERE (r.expires_at <= now()
       OR (r.fingerprint IS NOT DISTINCT FROM excluded.fingerprint
           AND (r.state = 'released' OR (r.state = 'in_progress' AND r.lease_until <= now()))))
