//! Column-aligned plain-text tables, like kubectl's (comfy-table).

/// A table with a header row.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Append a row (missing cells are empty, extra cells are dropped).
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// No rows yet.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, columns separated by at least three spaces
    /// (laid out by comfy-table, without borders or wrapping).
    pub fn render(&self) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING)
            .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
            .set_header(self.header.clone())
            .add_rows(self.rows.clone());
        for c in t.column_iter_mut() {
            c.set_padding((0, 3));
        }
        let mut out = String::new();
        for line in t.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["RANK", "POD"]);
        t.row(vec!["0".into(), "job-0".into()]);
        t.row(vec!["10".into(), "job-10".into()]);
        assert_eq!(t.render(), "RANK   POD\n0      job-0\n10     job-10\n");
    }
}
