//! [`PgBlobs`]: blobs in a table of their own (migration 0007), beside
//! the records, on the store's pool.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use idem::blob::{
    BlobEntry, BlobError, BlobFuture, BlobOwner, BlobPage, BlobReader, BlobStore, BlobWriter,
};
use idem::StoreError;

use crate::PgStore;

/// How many bytes a chunk row holds: rows far below PostgreSQL's 1 GB
/// field limit, few enough round trips for a large blob.
const CHUNK: usize = 1 << 20;

/// Blobs in `<schema>.idem_blobs` and `<schema>.idem_blob_chunks`, on a
/// [`PgStore`]'s pool. Each chunk is committed as it is written and the
/// blob marked finished last, so a crash leaves an unfinished blob (never
/// read, removed by the sweep), never a short one.
#[derive(Debug, Clone)]
pub struct PgBlobs {
    store: PgStore,
    sql: Sql,
}

#[derive(Debug, Clone)]
struct Sql {
    create: String,
    chunk: String,
    finish: String,
    finished: String,
    read: String,
    delete: String,
    list: String,
}

impl PgBlobs {
    /// Blobs beside `store`'s records (its schema must have migration
    /// 0007: [`PgStore::setup`] applies it).
    pub fn new(store: PgStore) -> Self {
        let schema = store.schema().to_owned();
        let sql = Sql {
            create: format!(
                "INSERT INTO {schema}.idem_blobs (locator, owner_scope, owner_key, owner_fence) \
                 VALUES ($1, $2, $3, $4)"
            ),
            chunk: format!(
                "INSERT INTO {schema}.idem_blob_chunks (locator, seq, data) VALUES ($1, $2, $3)"
            ),
            finish: format!(
                "UPDATE {schema}.idem_blobs SET finished = true, modified = now() \
                 WHERE locator = $1"
            ),
            finished: format!("SELECT finished FROM {schema}.idem_blobs WHERE locator = $1"),
            read: format!(
                "SELECT data FROM {schema}.idem_blob_chunks WHERE locator = $1 AND seq = $2"
            ),
            delete: format!("DELETE FROM {schema}.idem_blobs WHERE locator = $1"),
            list: format!(
                "SELECT locator, owner_scope, owner_key, owner_fence, finished, \
                 extract(epoch FROM modified)::float8 FROM {schema}.idem_blobs \
                 WHERE locator > $1 ORDER BY locator LIMIT $2"
            ),
        };
        Self { store, sql }
    }

    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, BlobError> {
        let run = async {
            let client = self.store.client().await?;
            let statement = self.store.prepare(&client, sql).await?;
            self.store.timed(client.execute(&statement, params)).await
        };
        run.await.map_err(unavailable)
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, BlobError> {
        let run = async {
            let client = self.store.client().await?;
            let statement = self.store.prepare(&client, sql).await?;
            self.store.timed(client.query(&statement, params)).await
        };
        run.await.map_err(unavailable)
    }
}

fn unavailable(error: StoreError) -> BlobError {
    BlobError::unavailable(idem::error_chain(&error))
}

struct PgWriter {
    blobs: PgBlobs,
    locator: String,
    seq: i32,
}

impl BlobWriter for PgWriter {
    fn write(&mut self, chunk: Bytes) -> BlobFuture<'_, ()> {
        Box::pin(async move {
            let seq = self.seq;
            self.blobs
                .execute(&self.blobs.sql.chunk, &[&self.locator, &seq, &&chunk[..]])
                .await?;
            self.seq += 1;
            Ok(())
        })
    }

    fn finish(self: Box<Self>) -> BlobFuture<'static, ()> {
        Box::pin(async move {
            let done = self
                .blobs
                .execute(&self.blobs.sql.finish, &[&self.locator])
                .await?;
            if done == 1 {
                Ok(())
            } else {
                Err(BlobError::unavailable(format!(
                    "blob {} was removed while it was written",
                    self.locator
                )))
            }
        })
    }
}

struct PgReader {
    blobs: PgBlobs,
    locator: String,
    seq: i32,
}

impl BlobReader for PgReader {
    fn next(&mut self) -> BlobFuture<'_, Option<Bytes>> {
        Box::pin(async move {
            let seq = self.seq;
            let rows = self
                .blobs
                .query(&self.blobs.sql.read, &[&self.locator, &seq])
                .await?;
            self.seq += 1;
            Ok(rows
                .first()
                .map(|row| Bytes::from(row.get::<_, Vec<u8>>(0))))
        })
    }
}

impl BlobStore for PgBlobs {
    fn chunk_bytes(&self) -> usize {
        CHUNK
    }

    fn create<'a>(
        &'a self,
        locator: &'a str,
        owner: &'a BlobOwner,
    ) -> BlobFuture<'a, Box<dyn BlobWriter>> {
        Box::pin(async move {
            let fence = i64::try_from(owner.fence).map_err(BlobError::unavailable)?;
            self.execute(
                &self.sql.create,
                &[&locator, &owner.scope, &owner.key, &fence],
            )
            .await?;
            Ok(Box::new(PgWriter {
                blobs: self.clone(),
                locator: locator.to_owned(),
                seq: 0,
            }) as Box<dyn BlobWriter>)
        })
    }

    fn open<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, Option<Box<dyn BlobReader>>> {
        Box::pin(async move {
            let rows = self.query(&self.sql.finished, &[&locator]).await?;
            let finished = rows.first().is_some_and(|row| row.get::<_, bool>(0));
            Ok(finished.then(|| {
                Box::new(PgReader {
                    blobs: self.clone(),
                    locator: locator.to_owned(),
                    seq: 0,
                }) as Box<dyn BlobReader>
            }))
        })
    }

    fn delete<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, bool> {
        Box::pin(async move { Ok(self.execute(&self.sql.delete, &[&locator]).await? > 0) })
    }

    fn list<'a>(&'a self, after: Option<&'a str>, limit: usize) -> BlobFuture<'a, BlobPage> {
        Box::pin(async move {
            let limit = limit.max(1);
            let rows = self
                .query(
                    &self.sql.list,
                    &[
                        &after.unwrap_or(""),
                        &i64::try_from(limit).unwrap_or(i64::MAX),
                    ],
                )
                .await?;
            let entries: Vec<BlobEntry> = rows
                .iter()
                .map(|row| {
                    let fence: i64 = row.get(3);
                    let epoch: f64 = row.get(5);
                    BlobEntry {
                        locator: row.get(0),
                        owner: u64::try_from(fence).ok().map(|fence| BlobOwner {
                            scope: row.get(1),
                            key: row.get(2),
                            fence,
                        }),
                        partial: !row.get::<_, bool>(4),
                        modified: UNIX_EPOCH + Duration::from_secs_f64(epoch.max(0.0)),
                    }
                })
                .collect();
            let next = (entries.len() == limit).then(|| entries[limit - 1].locator.clone());
            Ok(BlobPage { entries, next })
        })
    }
}

impl PgStore {
    /// A blob store in this store's schema, on its pool.
    pub fn blobs(&self) -> PgBlobs {
        PgBlobs::new(self.clone())
    }
}
