//! Connecting to the broker at an `amqp://` URL, the default virtual host
//! read as Python's and Node's clients read it.

use lapin::{Connection, ConnectionProperties};

/// Connects to `url`. A URL that names no virtual host (`amqp://host`,
/// `amqp://host/`) means the default one, `/`, as pika, aio-pika and
/// amqplib read it (lapin alone would ask for the virtual host `""`,
/// which the broker refuses).
pub(crate) async fn connect(url: &str) -> lapin::Result<Connection> {
    Connection::connect(&with_vhost(url), ConnectionProperties::default()).await
}

/// `url` with the default virtual host spelled out if it names none.
fn with_vhost(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (rest, None),
    };
    let authority_end = before_query.find('/').unwrap_or(before_query.len());
    let (authority, path) = before_query.split_at(authority_end);
    if !(path.is_empty() || path == "/") {
        return url.to_owned();
    }
    match query {
        Some(query) => format!("{scheme}://{authority}/%2f?{query}"),
        None => format!("{scheme}://{authority}/%2f"),
    }
}

#[cfg(test)]
mod tests {
    use super::with_vhost;

    #[test]
    fn a_url_without_a_virtual_host_names_the_default_one() {
        for (given, meant) in [
            ("amqp://g:g@h:5672", "amqp://g:g@h:5672/%2f"),
            ("amqp://g:g@h:5672/", "amqp://g:g@h:5672/%2f"),
            ("amqp://h/?heartbeat=5", "amqp://h/%2f?heartbeat=5"),
            ("amqp://h/%2f", "amqp://h/%2f"),
            ("amqps://h/orders", "amqps://h/orders"),
        ] {
            assert_eq!(with_vhost(given), meant, "{given}");
        }
    }
}
