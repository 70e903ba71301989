//! The one vocabulary of faults every run injects: what happens to a
//! process, to a server, or to a link between them.

/// A connection the runs put a fault proxy on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// The link to idem's side: from the workers to their store, or from
    /// HTTP clients to the gateway.
    Idem,
    /// From the consumers to their broker.
    Broker,
}

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL a worker (or the gateway); a new one replaces it.
    Kill,
    /// SIGSTOP a worker for 1.5 to 3 leases, then SIGCONT it.
    Stop,
    /// Make a worker leave cleanly (it stops taking deliveries and
    /// finishes those in flight) while a new one joins in its place.
    Leave,
    /// Jump a worker's wall clock 1.5 to 3 leases forward or back.
    Clock,
    /// Crash the store and start it again (SQLite: SIGKILL every process
    /// that has the file open; a Redis Cluster: SIGKILL a master, promote
    /// its replica, replace the dead node with a new replica).
    StoreRestart,
    /// Kill the broker and start it again.
    BrokerRestart,
    /// Move slots, with their records, from one Cluster master to
    /// another under load.
    Migrate,
    /// Hold idem's PostgreSQL table locked against writes for a while,
    /// past the workers' lock and statement timeouts.
    Locks,
    /// Delay every chunk through the link's proxy for a while.
    Latency(Link),
    /// Let nothing through the link's proxy for a while.
    Blackhole(Link),
    /// Reset every connection through the link's proxy.
    Reset(Link),
    /// Cut answers through the link's proxy off midway for a while.
    Cut(Link),
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 16] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Leave,
        Fault::Clock,
        Fault::StoreRestart,
        Fault::BrokerRestart,
        Fault::Migrate,
        Fault::Locks,
        Fault::Latency(Link::Idem),
        Fault::Blackhole(Link::Idem),
        Fault::Reset(Link::Idem),
        Fault::Cut(Link::Idem),
        Fault::Latency(Link::Broker),
        Fault::Blackhole(Link::Broker),
        Fault::Reset(Link::Broker),
        Fault::Cut(Link::Broker),
    ];

    /// The network faults on `link`.
    pub fn on_link(link: Link) -> [Fault; 4] {
        [
            Fault::Latency(link),
            Fault::Blackhole(link),
            Fault::Reset(link),
            Fault::Cut(link),
        ]
    }

    /// Its name in reports and on the command line: `latency` on the link
    /// to idem's side, `broker-latency` on the broker's.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Leave => "leave",
            Fault::Clock => "clock",
            Fault::StoreRestart => "restart",
            Fault::BrokerRestart => "broker-restart",
            Fault::Migrate => "migrate",
            Fault::Locks => "locks",
            Fault::Latency(Link::Idem) => "latency",
            Fault::Blackhole(Link::Idem) => "blackhole",
            Fault::Reset(Link::Idem) => "reset",
            Fault::Cut(Link::Idem) => "cut",
            Fault::Latency(Link::Broker) => "broker-latency",
            Fault::Blackhole(Link::Broker) => "broker-blackhole",
            Fault::Reset(Link::Broker) => "broker-reset",
            Fault::Cut(Link::Broker) => "broker-cut",
        }
    }

    /// The kind called `name`; `store-` before a name is the same kind
    /// (`store-restart`, `store-latency`: the consumer runs' first names).
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim();
        let bare = name.strip_prefix("store-").unwrap_or(name);
        Self::ALL.into_iter().find(|k| k.name() == bare)
    }

    /// The kinds named in `names` (comma separated), or an error naming
    /// the known ones.
    pub fn parse_list(names: &str) -> Result<Vec<Self>, String> {
        names
            .split(',')
            .filter(|n| !n.trim().is_empty())
            .map(|name| {
                Self::parse(name).ok_or_else(|| {
                    let known: Vec<_> = Self::ALL.iter().map(|f| f.name()).collect();
                    format!("no fault {name:?}; known: {}", known.join(", "))
                })
            })
            .collect()
    }

    /// The link a network fault is on; `None` for the others, which the
    /// run's target injects itself.
    pub fn link(self) -> Option<Link> {
        match self {
            Fault::Latency(link)
            | Fault::Blackhole(link)
            | Fault::Reset(link)
            | Fault::Cut(link) => Some(link),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_the_store_prefix_is_the_same_kind() {
        for kind in Fault::ALL {
            assert_eq!(Fault::parse(kind.name()), Some(kind));
        }
        assert_eq!(Fault::parse("store-restart"), Some(Fault::StoreRestart));
        assert_eq!(
            Fault::parse("store-blackhole"),
            Some(Fault::Blackhole(Link::Idem))
        );
        assert_eq!(Fault::parse("broker-store-reset"), None);
        let unknown = Fault::parse_list("kill,nope").expect_err("an unknown name");
        assert!(unknown.contains("\"nope\""), "{unknown}");
        assert_eq!(
            Fault::parse_list("kill, reset"),
            Ok(vec![Fault::Kill, Fault::Reset(Link::Idem)])
        );
    }
}
