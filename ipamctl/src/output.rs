//! How every command prints: a human table by default, or the same answer as JSON or YAML with
//! stable camelCase field names (documented in docs/operations.md).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
    Yaml,
}

/// Prints `answer` as JSON or YAML, or hands it to `human` for the table form.
pub(crate) fn emit<T: Serialize>(
    output: Output,
    answer: &T,
    human: impl FnOnce(&T),
) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(answer)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(answer)?),
        Output::Table => human(answer),
    }
    Ok(())
}

/// A plain table: a header row, columns sized to their content, no borders (easy to read, grep
/// and paste into an issue).
pub(crate) fn table<const N: usize>(header: [&str; N]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header);
    t
}

/// `[#####.....]`: how full, in 20 steps.
pub(crate) fn usage_bar(used: u128, total: u128) -> String {
    let filled = if total == 0 {
        0
    } else {
        ((used * 20).div_ceil(total)).min(20) as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(20 - filled))
}

/// `a,b,c`, or `-` for none.
pub(crate) fn joined<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(",")
    }
}
