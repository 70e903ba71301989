//! [`DirBlobs`]: blobs as files in a directory, for the embedded store.
//!
//! A blob at `RECORD/FENCE-NONCE` is the file of that name under the
//! root: a header (`idem-blob 1`, then its [`BlobOwner`] as JSON, each on
//! a line) and the blob's bytes. It is written as `….partial`, synced,
//! renamed to its name and the directory synced, so a crash leaves either
//! no blob or a whole one (and maybe a partial file, which
//! [`sweep`](super::sweep) removes).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{
    BlobEntry, BlobError, BlobFuture, BlobOwner, BlobPage, BlobReader, BlobStore, BlobWriter,
};

/// The first line of every blob file.
const MAGIC: &[u8] = b"idem-blob 1\n";
/// What a blob being written ends its name with.
const PARTIAL: &str = ".partial";
/// The longest header read back (the owner's scope and key are bounded).
const MAX_HEADER: usize = 4096;
/// How much is read at a time, in one call on a blocking thread (writes
/// come in [`BlobStore::chunk_bytes`]).
const CHUNK: usize = 256 * 1024;

/// Blobs as files under a root directory (created if missing).
#[derive(Debug, Clone)]
pub struct DirBlobs {
    root: PathBuf,
}

impl DirBlobs {
    /// Blobs under `root`, which is created if it does not exist.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, BlobError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| {
            BlobError::unavailable(format!(
                "cannot create blob directory {}: {e}",
                root.display()
            ))
        })?;
        Ok(Self { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of `locator`, refused unless it is two plain names.
    fn path(&self, locator: &str) -> Result<PathBuf, BlobError> {
        let plain = |part: &str| {
            !part.is_empty()
                && !part.starts_with('.')
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        match locator.split_once('/') {
            Some((dir, name)) if plain(dir) && plain(name) => Ok(self.root.join(dir).join(name)),
            _ => Err(BlobError::unavailable(format!(
                "{locator:?} is not a blob locator of a directory store"
            ))),
        }
    }
}

/// Where the blob at `path` is written before it is finished.
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().expect("a blob is named").to_owned();
    name.push(PARTIAL);
    path.with_file_name(name)
}

fn io<'a>(path: &'a Path, what: &str) -> impl FnOnce(std::io::Error) -> BlobError + 'a {
    let what = what.to_owned();
    move |e| BlobError::unavailable(format!("{what} {}: {e}", path.display()))
}

/// Runs file work on a blocking thread: each call is one hop there and
/// back, so a call does as much as it can.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, BlobError> + Send + 'static,
) -> Result<T, BlobError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(BlobError::unavailable)?
}

struct DirWriter {
    file: Option<std::fs::File>,
    partial: PathBuf,
    path: PathBuf,
}

impl Drop for DirWriter {
    fn drop(&mut self) {
        // Never finished: what was written is of no use. Best effort: the
        // sweep removes it if this does not.
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

impl BlobWriter for DirWriter {
    fn write(&mut self, chunk: Bytes) -> BlobFuture<'_, ()> {
        Box::pin(async move {
            let mut file = self.file.take().expect("a writer is used until finished");
            let partial = self.partial.clone();
            let file = blocking(move || {
                file.write_all(&chunk).map_err(io(&partial, "writing"))?;
                Ok(file)
            })
            .await?;
            self.file = Some(file);
            Ok(())
        })
    }

    fn finish(mut self: Box<Self>) -> BlobFuture<'static, ()> {
        Box::pin(async move {
            let file = self.file.take().expect("finished once");
            let (partial, path) = (self.partial.clone(), self.path.clone());
            blocking(move || {
                file.sync_all().map_err(io(&partial, "syncing"))?;
                drop(file);
                std::fs::rename(&partial, &path).map_err(io(&path, "naming"))?;
                // The rename survives a crash once its directory is synced.
                let dir = path.parent().expect("a blob has a directory");
                std::fs::File::open(dir)
                    .and_then(|dir| dir.sync_all())
                    .map_err(io(dir, "syncing"))
            })
            .await
        })
    }
}

struct DirReader {
    file: Option<BufReader<std::fs::File>>,
    path: PathBuf,
}

impl BlobReader for DirReader {
    fn next(&mut self) -> BlobFuture<'_, Option<Bytes>> {
        Box::pin(async move {
            // The last read came up short: the end, without another hop.
            let Some(mut file) = self.file.take() else {
                return Ok(None);
            };
            let path = self.path.clone();
            let (file, chunk) = blocking(move || {
                let mut buf = vec![0; CHUNK];
                let mut filled = 0;
                while filled < CHUNK {
                    match file.read(&mut buf[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(io(&path, "reading")(e)),
                    }
                }
                buf.truncate(filled);
                Ok(((filled == CHUNK).then_some(file), buf))
            })
            .await?;
            self.file = file;
            Ok((!chunk.is_empty()).then(|| Bytes::from(chunk)))
        })
    }
}

/// Reads a blob file's header: its owner, and the file positioned at its
/// first byte of data.
fn header(path: &Path) -> Result<Option<(BlobOwner, BufReader<std::fs::File>)>, BlobError> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path, "opening")(e)),
    };
    let mut file = BufReader::with_capacity(CHUNK, file);
    let corrupt = |reason: &str| BlobError::Corrupt {
        locator: path.display().to_string(),
        reason: reason.to_owned(),
    };
    let mut head = Vec::new();
    for _ in 0..2 {
        let mut line = Vec::new();
        (&mut file)
            .take(MAX_HEADER as u64)
            .read_until(b'\n', &mut line)
            .map_err(io(path, "reading"))?;
        if line.last() != Some(&b'\n') {
            return Err(corrupt("its header is cut off"));
        }
        head.push(line);
    }
    if head[0] != MAGIC {
        return Err(corrupt("it is not an idem blob (layout 1)"));
    }
    let owner = serde_json::from_slice(&head[1]).map_err(|_| corrupt("its owner is unreadable"))?;
    Ok(Some((owner, file)))
}

impl BlobStore for DirBlobs {
    fn create<'a>(
        &'a self,
        locator: &'a str,
        owner: &'a BlobOwner,
    ) -> BlobFuture<'a, Box<dyn BlobWriter>> {
        Box::pin(async move {
            let path = self.path(locator)?;
            let partial = partial_path(&path);
            let mut head = MAGIC.to_vec();
            serde_json::to_writer(&mut head, owner).map_err(BlobError::unavailable)?;
            head.push(b'\n');
            let file = {
                let partial = partial.clone();
                blocking(move || {
                    let dir = partial.parent().expect("a blob has a directory");
                    std::fs::create_dir_all(dir).map_err(io(dir, "creating"))?;
                    let mut file =
                        std::fs::File::create(&partial).map_err(io(&partial, "creating"))?;
                    file.write_all(&head).map_err(io(&partial, "writing"))?;
                    Ok(file)
                })
                .await?
            };
            Ok(Box::new(DirWriter {
                file: Some(file),
                partial,
                path,
            }) as Box<dyn BlobWriter>)
        })
    }

    fn open<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, Option<Box<dyn BlobReader>>> {
        Box::pin(async move {
            let path = self.path(locator)?;
            let opened = {
                let path = path.clone();
                blocking(move || header(&path)).await?
            };
            Ok(opened.map(|(_, file)| {
                Box::new(DirReader {
                    file: Some(file),
                    path,
                }) as Box<dyn BlobReader>
            }))
        })
    }

    fn delete<'a>(&'a self, locator: &'a str) -> BlobFuture<'a, bool> {
        Box::pin(async move {
            let path = self.path(locator)?;
            blocking(move || {
                let mut removed = false;
                for path in [partial_path(&path), path.clone()] {
                    match std::fs::remove_file(&path) {
                        Ok(()) => removed = true,
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => return Err(io(&path, "removing")(e)),
                    }
                }
                // The record's directory goes when its last blob does.
                let _ = std::fs::remove_dir(path.parent().expect("a blob has a directory"));
                Ok(removed)
            })
            .await
        })
    }

    fn list<'a>(&'a self, after: Option<&'a str>, limit: usize) -> BlobFuture<'a, BlobPage> {
        Box::pin(async move {
            let store = self.clone();
            let after = after.map(str::to_owned);
            let limit = limit.max(1);
            blocking(move || {
                let found = list_files(&store.root, after.as_deref(), limit)?;
                let mut entries = Vec::with_capacity(found.len());
                for (locator, partial, modified) in found {
                    let mut path = store.path(&locator)?;
                    if partial {
                        path = partial_path(&path);
                    }
                    // A header cut off by a crash is no owner: swept once
                    // old.
                    let owner = header(&path).ok().flatten().map(|(owner, _)| owner);
                    entries.push(BlobEntry {
                        locator,
                        owner,
                        partial,
                        modified,
                    });
                }
                let next = (entries.len() == limit).then(|| entries[limit - 1].locator.clone());
                Ok(BlobPage { entries, next })
            })
            .await
        })
    }
}
/// Up to `limit` blob files after `after`, in locator order: each one's
/// locator, whether it is partial, and when it was last written.
fn list_files(
    root: &Path,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, bool, std::time::SystemTime)>, BlobError> {
    let names = |dir: &Path| -> Result<Vec<String>, BlobError> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(io(dir, "listing"))?
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    };
    let after_dir = after.and_then(|a| a.split_once('/')).map(|(d, _)| d);
    let mut found = Vec::new();
    for dir in names(root)? {
        if after_dir.is_some_and(|after| dir.as_str() < after) {
            continue;
        }
        let path = root.join(&dir);
        if !path.is_dir() {
            continue;
        }
        for name in names(&path).unwrap_or_default() {
            let partial = name.ends_with(PARTIAL);
            let locator = format!("{dir}/{}", name.trim_end_matches(PARTIAL));
            if after.is_some_and(|after| locator.as_str() <= after) {
                continue;
            }
            let Ok(meta) = std::fs::metadata(path.join(&name)) else {
                continue;
            };
            let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            found.push((locator, partial, modified));
            if found.len() == limit {
                return Ok(found);
            }
        }
    }
    Ok(found)
}
