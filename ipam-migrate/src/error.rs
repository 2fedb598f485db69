//! Why a conversion stopped: nothing half converted is printed.

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{file}: document {document} is not valid YAML: {source}")]
    Yaml {
        file: String,
        document: usize,
        source: serde_yaml_ng::Error,
    },
    #[error("{from}: {field}: {why}. Nothing was converted")]
    Field {
        from: String,
        field: String,
        why: String,
    },
    #[error(
        "{first} and {second} would both become the {kind} {name}; rename one of them (or \
         convert them separately) before migrating"
    )]
    Clash {
        kind: &'static str,
        name: String,
        first: String,
        second: String,
    },
}
