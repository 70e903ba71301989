//! What the standalone transactional outboxes share
//! (`idem_postgres::Outbox`, `idem_mysql::outbox::Outbox`,
//! `idem_sqlite::outbox::Outbox`): how a message is kept in a row and read
//! back, the rule of a dispatch pass (in order, stopping at the first
//! message not confirmed), what a pass did, and the loops around passes.

use std::future::Future;
use std::time::Duration;

use super::message::{Message, Sender};
use crate::key::Key;

/// How long a dispatcher keeps the rows it took before they come due for
/// another: longer than a batch takes to send.
pub const DEFAULT_DISPATCH_LEASE: Duration = Duration::from_secs(30);

/// What one pass of a standalone outbox's dispatcher did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxPass {
    /// Rows taken.
    pub taken: usize,
    /// Messages the broker confirmed (and their rows deleted).
    pub sent: usize,
    /// Whether a send failed, or a row did not read (the rest of the batch
    /// comes due again after the lease).
    pub failed: bool,
}

impl OutboxPass {
    /// Whether the pass took a whole batch of `batch` and sent it all:
    /// more may be due, so look again at once.
    pub fn is_full(&self, batch: usize) -> bool {
        self.taken >= batch.max(1) && !self.failed
    }
}

impl std::ops::AddAssign for OutboxPass {
    fn add_assign(&mut self, other: Self) {
        self.taken += other.taken;
        self.sent += other.sent;
        self.failed |= other.failed;
    }
}

/// Passes of `pass` (one batch of `batch` each) until one takes less
/// than a full batch or a send fails: everything due, summed. What a
/// dispatcher does at each look.
pub async fn dispatch_due<F, Fut, E>(batch: usize, mut pass: F) -> Result<OutboxPass, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<OutboxPass, E>>,
{
    let mut total = OutboxPass::default();
    loop {
        let this = pass().await?;
        total += this;
        if !this.is_full(batch) {
            return Ok(total);
        }
    }
}

/// A dispatcher that looks on a timer (for databases that tell no other
/// connection of a commit): `due` (a [`dispatch_due`]) every `every`,
/// errors logged and tried again at the next look. Never returns.
pub async fn dispatch_every<F, Fut, E>(every: Duration, mut due: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<OutboxPass, E>>,
    E: std::error::Error,
{
    loop {
        if let Err(error) = due().await {
            tracing::warn!(error = %crate::error_chain(&error), "the outbox dispatcher's pass failed; trying again at the next look");
        }
        tokio::time::sleep(every).await;
    }
}

/// A taken row: its sequence number, and its message or why the row does
/// not read.
pub type TakenRow = (i64, Result<Message, String>);

/// A message's headers as a row keeps them: a JSON array of
/// `[name, value]` pairs, in order.
pub fn headers_json(message: &Message) -> String {
    serde_json::to_string(message.headers()).unwrap_or_else(|_| String::from("[]"))
}

/// The message a row keeps: its id, destination, headers (as
/// [`headers_json`] wrote them) and payload; why not, for a row that does
/// not read.
pub fn message_from_row(
    id: &str,
    destination: String,
    headers: &str,
    payload: Vec<u8>,
) -> Result<Message, String> {
    let headers: Vec<(String, String)> =
        serde_json::from_str(headers).map_err(|e| format!("its headers: {e}"))?;
    let id = Key::new(id).map_err(|e| format!("its id: {e}"))?;
    Ok(headers.into_iter().fold(
        Message::new(destination, payload).with_id(id),
        |m, (name, value)| m.header(name, value),
    ))
}

/// Sends the messages of taken rows, given as `(seq, message or why it
/// does not read)` in the order they were enqueued, through `sender`, one
/// at a time, stopping at the first row that does not read or whose send
/// is not confirmed (later messages must not overtake it). The sequence
/// numbers of the confirmed ones, and whether it stopped early.
pub async fn send_in_order(
    rows: impl IntoIterator<Item = TakenRow>,
    sender: &impl Sender,
) -> (Vec<i64>, bool) {
    let mut sent = Vec::new();
    for (seq, message) in rows {
        let message = match message {
            Ok(message) => message,
            Err(reason) => {
                tracing::error!(%reason, seq, "an outbox row does not read; left for an operator");
                return (sent, true);
            }
        };
        if let Err(error) = sender.send(&message).await {
            tracing::warn!(%error, id = message.id(), destination = message.destination(), "an outbox message was not sent; it comes due again after the lease");
            return (sent, true);
        }
        sent.push(seq);
    }
    (sent, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::MemorySender;

    #[test]
    fn a_row_gives_back_the_message_it_was_written_from() {
        let message = Message::new("order-events", "placed 7")
            .header("order", "7")
            .header("kind", "placed");
        let back = message_from_row(
            message.id(),
            message.destination().to_owned(),
            &headers_json(&message),
            message.payload().to_vec(),
        )
        .expect("reads");
        assert_eq!(back.id(), message.id());
        assert_eq!(back.destination(), "order-events");
        assert_eq!(back.headers(), message.headers());
        assert_eq!(back.payload(), message.payload());
        let broken = message_from_row("k", "d".into(), "{not json", Vec::new());
        assert!(broken.is_err_and(|why| why.starts_with("its headers")));
        let bad_id = message_from_row("", "d".into(), "[]", Vec::new());
        assert!(bad_id.is_err_and(|why| why.starts_with("its id")));
    }

    #[tokio::test]
    async fn a_pass_stops_at_the_first_message_not_sent() {
        let sender = MemorySender::new();
        let rows = |n: i64| (n, Ok(Message::new("d", format!("m{n}"))));
        let (sent, stopped) = send_in_order([rows(1), rows(2)], &sender).await;
        assert_eq!((sent, stopped), (vec![1, 2], false));
        let (sent, stopped) =
            send_in_order([rows(3), (4, Err("broken".into())), rows(5)], &sender).await;
        assert_eq!((sent, stopped), (vec![3], true));
        sender.fail(true);
        let (sent, stopped) = send_in_order([rows(6)], &sender).await;
        assert_eq!((sent, stopped), (vec![], true));
        assert_eq!(
            sender.messages().len(),
            3,
            "nothing after the stop was sent"
        );
    }
}
