//! The cluster URL: `etcd://[user[:password]@]host:port[,host:port…]/namespace`, or `etcds://`
//! for TLS, where `?ca=FILE&cert=FILE&key=FILE` names the CA and a client certificate.

use crate::error::ClusterError;
use std::path::PathBuf;

/// A parsed cluster URL and the options that go with it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// `host:port` of each etcd endpoint, in the order given.
    pub endpoints: Vec<String>,
    /// The namespace: every key of this cluster lies under `/<namespace>/`.
    pub namespace: String,
    /// TLS (`etcds://`).
    pub tls: bool,
    /// etcd user (auth enabled on the server).
    pub user: Option<String>,
    /// Its password: from the URL, else `GDPATH_ETCD_PASSWORD` (a command line is visible to
    /// other users of the host, the environment is not).
    pub password: Option<String>,
    /// PEM file of the CA that signs etcd's certificate (`etcds://…?ca=FILE`, or `--etcd-ca`);
    /// the system roots are not consulted.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for etcd's client-certificate auth
    /// (`etcds://…?cert=FILE&key=FILE`, or `--etcd-cert` and `--etcd-key`).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for ClusterUrl {
    // The password never goes into a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_string())
    }
}

impl std::fmt::Display for ClusterUrl {
    /// The URL without its password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let user = self
            .user
            .as_deref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        write!(
            f,
            "{scheme}://{user}{}/{}",
            self.endpoints.join(","),
            self.namespace
        )
    }
}

/// Longest cluster URL accepted, in bytes.
const MAX_URL_BYTES: usize = 4096;
/// Most endpoints in one URL.
const MAX_ENDPOINTS: usize = 64;

impl std::str::FromStr for ClusterUrl {
    type Err = ClusterError;

    fn from_str(s: &str) -> Result<Self, ClusterError> {
        let bad = |why: &str| {
            ClusterError::Url(format!(
                "{}: {why} (expected etcd://host:port[,host:port…]/namespace or \
                 etcds://…/namespace[?ca=FILE&cert=FILE&key=FILE])",
                gdpath::topo::text::escape(s)
            ))
        };
        if s.len() > MAX_URL_BYTES {
            return Err(bad("too long"));
        }
        let (tls, rest) = if let Some(r) = s.strip_prefix("etcd://") {
            (false, r)
        } else if let Some(r) = s.strip_prefix("etcds://") {
            (true, r)
        } else {
            return Err(bad("unknown scheme"));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (mut ca_file, mut cert, mut key) = (None, None, None);
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            let (name, value) = pair
                .split_once('=')
                .filter(|(_, v)| !v.is_empty())
                .ok_or_else(|| bad("each query parameter is NAME=FILE"))?;
            let slot = match name {
                "ca" => &mut ca_file,
                "cert" => &mut cert,
                "key" => &mut key,
                _ => return Err(bad("the query parameters are ca, cert and key")),
            };
            if slot.replace(PathBuf::from(value)).is_some() {
                return Err(bad("a query parameter is given twice"));
            }
        }
        if !tls && (ca_file.is_some() || cert.is_some()) {
            return Err(bad("ca, cert and key apply to TLS: write etcds://"));
        }
        let client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(bad("cert and key go together")),
        };
        let (authority, namespace) = rest.split_once('/').ok_or_else(|| bad("no namespace"))?;
        if !crate::record::valid_name(namespace) {
            return Err(bad(
                "the namespace must be 1 to 31 characters of A-Z a-z 0-9 . _ -",
            ));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((u, p)) => (Some(u.to_owned()), Some(p.to_owned())),
                None => (Some(u.to_owned()), None),
            },
        };
        if user.as_deref() == Some("") {
            return Err(bad("empty user name"));
        }
        let password = password.or_else(|| {
            user.as_ref()
                .and_then(|_| std::env::var("GDPATH_ETCD_PASSWORD").ok())
        });
        let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        if endpoints.len() > MAX_ENDPOINTS {
            return Err(bad("too many endpoints"));
        }
        for e in &endpoints {
            let ok = e
                .rsplit_once(':')
                .is_some_and(|(h, p)| valid_host(h) && p.parse::<u16>().is_ok());
            if !ok {
                return Err(bad("each endpoint is host:port"));
            }
        }
        Ok(ClusterUrl {
            endpoints,
            namespace: namespace.to_owned(),
            tls,
            user,
            password,
            ca_file,
            client_cert,
        })
    }
}

/// A host name or IPv4 address (`A-Z a-z 0-9 - .`), or an IPv6 address in brackets
/// (`[::1]`): what the client's URI parser takes, so that a malformed one is refused here
/// rather than at connect.
fn valid_host(h: &str) -> bool {
    match h.strip_prefix('[') {
        Some(rest) => rest
            .strip_suffix(']')
            .is_some_and(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok()),
        None => {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        }
    }
}

impl ClusterUrl {
    /// The endpoints as etcd-client takes them (`http://` or `https://`).
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }

    /// The key of agent `name`: `/<namespace>/agents/<name>`.
    pub fn agent_key(&self, name: &str) -> String {
        format!("{}{name}", self.agents_prefix())
    }

    /// The prefix of every agent record: `/<namespace>/agents/`.
    pub fn agents_prefix(&self) -> String {
        format!("/{}/agents/", self.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn urls_parse_and_bad_ones_are_refused() {
        let u: ClusterUrl = "etcd://127.0.0.1:2379,h2:2379/prod".parse().unwrap();
        assert_eq!(u.endpoints, ["127.0.0.1:2379", "h2:2379"]);
        assert_eq!(u.namespace, "prod");
        assert!(!u.tls);
        assert_eq!(u.agent_key("a"), "/prod/agents/a");
        let u: ClusterUrl = "etcd://[::1]:23790/ns".parse().unwrap();
        assert_eq!(u.endpoints, ["[::1]:23790"]);
        let u: ClusterUrl = "etcds://root:pw@h:1/x".parse().unwrap();
        assert!(u.tls);
        assert_eq!(u.user.as_deref(), Some("root"));
        assert_eq!(u.password.as_deref(), Some("pw"));
        // The password is never shown.
        assert_eq!(u.to_string(), "etcds://root@h:1/x");
        assert_eq!(format!("{u:?}"), "etcds://root@h:1/x");
        let u: ClusterUrl = "etcds://h:1/x?ca=/etc/ca.pem&cert=c.pem&key=/k.pem"
            .parse()
            .unwrap();
        assert_eq!(u.namespace, "x");
        assert_eq!(u.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(
            u.client_cert,
            Some((PathBuf::from("c.pem"), PathBuf::from("/k.pem")))
        );
        for bad in [
            "etcd://h:1/x?ca=a.pem",
            "etcds://h:1/x?cert=c.pem",
            "etcds://h:1/x?ca=a&ca=b",
            "etcds://h:1/x?pw=x",
            "etcds://h:1/x?ca=",
            "http://h:1/x",
            "etcd://h:1",
            "etcd://h/x",
            "etcd://h:1/",
            "etcd://h:1/a/b",
            "etcd://h:99999/x",
            "etcd://@h:1/x",
            "etcd://h:1/\u{1b}[2J",
            "etcd://[::1:23790/ns",
            "etcd://::1]:23790/ns",
            "etcd://[nothost]:1/ns",
            "etcd://h:1:2/ns",
        ] {
            assert!(bad.parse::<ClusterUrl>().is_err(), "{bad}");
        }
    }
}
