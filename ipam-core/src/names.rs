//! Object names as Kubernetes allows them, checked by every store: the Kubernetes API server
//! checks them there, and the etcd and embedded stores check the same rules, so a name that
//! works on one store works on all, and no name carries a character that could break a file
//! written from it (BIRD's configuration, a log line, a path).
//!
//! - A cluster-scoped object's name is a DNS-1123 subdomain: at most 253 characters, lower-case
//!   letters, digits, `-` and `.`, starting and ending with a letter or digit.
//! - A namespaced object is stored as `<namespace>/<name>`: the namespace a DNS-1123 label (at
//!   most 63 characters, no `.`), the name a subdomain.

/// The longest name Kubernetes accepts (a DNS subdomain).
pub const MAX_NAME_LEN: usize = 253;
/// The longest namespace (a DNS label).
pub const MAX_NAMESPACE_LEN: usize = 63;

/// Why `name` cannot name an object, with the rule it breaks; `None` when it can.
pub fn invalid_name(name: &str) -> Option<String> {
    match name.split_once('/') {
        Some((namespace, rest)) => {
            if let Some(why) = invalid_label(namespace) {
                return Some(format!("its namespace {namespace:?} {why}"));
            }
            invalid_subdomain(rest)
                .map(|why| format!("the name {rest:?} after its namespace {why}"))
        }
        None => invalid_subdomain(name),
    }
}

fn invalid_subdomain(name: &str) -> Option<String> {
    if name.len() > MAX_NAME_LEN {
        return Some(format!(
            "is {} characters long; a name is a DNS-1123 subdomain of at most {MAX_NAME_LEN}",
            name.len()
        ));
    }
    invalid_characters(name, true)
}

fn invalid_label(name: &str) -> Option<String> {
    if name.len() > MAX_NAMESPACE_LEN {
        return Some(format!(
            "is {} characters long; a namespace is a DNS-1123 label of at most \
             {MAX_NAMESPACE_LEN}",
            name.len()
        ));
    }
    invalid_characters(name, false)
}

fn invalid_characters(name: &str, dots: bool) -> Option<String> {
    let rule = if dots {
        "a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', starting and ending with a \
         letter or digit"
    } else {
        "a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter \
         or digit"
    };
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bad = name
        .chars()
        .find(|&c| !(alphanumeric(c) || c == '-' || (dots && c == '.')));
    let ends_ok = name.starts_with(alphanumeric) && name.ends_with(alphanumeric);
    match bad {
        Some(c) => Some(format!("holds {c:?}; it must be {rule}")),
        None if name.is_empty() => Some(format!("is empty; it must be {rule}")),
        None if !ends_ok => Some(format!("must start and end with a letter or digit: {rule}")),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kubernetes() {
        for good in ["web", "node-1", "a.b-c", "shop/web", "kube-system/x.y", "0"] {
            assert_eq!(invalid_name(good), None, "{good}");
        }
        for (bad, says) in [
            ("peer\"one", "holds '\"'"),
            ("Web", "holds 'W'"),
            ("under_score", "holds '_'"),
            ("-lead", "start and end"),
            ("trail.", "start and end"),
            ("", "is empty"),
            ("sh.op/web", "its namespace \"sh.op\" holds '.'"),
            ("shop/", "after its namespace is empty"),
            ("a/b/c", "holds '/'"),
            ("with space", "holds ' '"),
            ("new\nline", "holds '\\n'"),
        ] {
            let why = invalid_name(bad).unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(why.contains(says), "{bad:?}: {why}");
        }
        assert!(
            invalid_name(&"a".repeat(254))
                .unwrap()
                .contains("at most 253")
        );
        assert!(
            invalid_name(&format!("{}/x", "a".repeat(64)))
                .unwrap()
                .contains("at most 63")
        );
    }
}
