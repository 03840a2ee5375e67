//! Standard output. Everything a command prints goes through [`print`], which returns
//! the write error instead of panicking as `println!` does, so that a reader that stops
//! early (`pebble models | head -3`) ends pebble quietly (see `error::is_broken_pipe`).

use std::io::Write;

/// Writes `text` to standard output and flushes it.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Writes one JSON value, pretty, followed by a newline.
pub fn print_json(value: &serde_json::Value) -> std::io::Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    text.push('\n');
    print(&text)
}

/// A plain-text table: columns padded to their widest cell, right-aligned where `right`
/// says so (numbers), left-aligned otherwise.
pub fn table(header: &[String], rows: &[Vec<String>], right: &[bool]) -> String {
    let cols = header.len();
    let mut width = vec![0; cols];
    for row in std::iter::once(header).chain(rows.iter().map(|r| r.as_slice())) {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let line = |row: &[String]| {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .take(cols)
            .map(|(i, c)| {
                let pad = " ".repeat(width[i] - c.chars().count());
                if right.get(i).copied().unwrap_or(false) {
                    format!("{pad}{c}")
                } else {
                    format!("{c}{pad}")
                }
            })
            .collect();
        format!("{}\n", cells.join("  ").trim_end())
    };
    let mut text = line(header);
    for row in rows {
        text.push_str(&line(row));
    }
    text
}
