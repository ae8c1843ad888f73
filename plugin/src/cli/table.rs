//! Plain-text tables whose columns are as wide as their widest cell, so long device ids, pool
//! names or claim UIDs never push a row out of line.

/// A table: a header row and rows of cells; the last column is left unpadded.
pub struct Table {
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    /// A table with these column headers; a header starting with `>` is right-aligned (the `>`
    /// is not printed).
    pub fn new(headers: &[&str]) -> Table {
        let right = headers.iter().map(|h| h.starts_with('>')).collect();
        let header = headers
            .iter()
            .map(|h| h.trim_start_matches('>').to_string())
            .collect();
        Table {
            rows: vec![header],
            right,
        }
    }

    /// Adds a row; missing cells are empty, extra ones are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.right.len(), String::new());
        self.rows.push(cells);
    }

    /// The rows after the header.
    pub fn len(&self) -> usize {
        self.rows.len() - 1
    }

    /// Whether there are no rows after the header.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table as lines, each prefixed with `indent`, columns two spaces apart.
    pub fn render(&self, indent: &str) -> String {
        let columns = self.right.len();
        let width: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::from(indent);
            for (c, cell) in row.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                let pad = width[c] - cell.chars().count();
                let last = c + 1 == columns;
                if self.right[c] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if !last {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_grow_to_their_widest_cell() {
        let mut t = Table::new(&["DEVICE", ">USED", "holders"]);
        t.row(vec![
            "a-very-long-device-id-0000:3b:00.0".into(),
            "1/1".into(),
            "c1".into(),
        ]);
        t.row(vec!["g1".into(), "0/4".into(), String::new()]);
        let text = t.render("");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "DEVICE                              USED  holders"
        );
        assert_eq!(lines[1], "a-very-long-device-id-0000:3b:00.0   1/1  c1");
        assert_eq!(lines[2], "g1                                   0/4");
    }
}
