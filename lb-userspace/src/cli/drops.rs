//! `lbctl drops`: the drop counters by reason and direction.
use crate::maps::bpf::DropCount;

pub fn render_table(counts: &[DropCount]) -> String {
    let mut table = vec![["Reason".to_string(), "Direction".into(), "Packets".into()]];
    for c in counts {
        table.push([
            c.reason.to_string(),
            c.direction.to_string(),
            c.packets.to_string(),
        ]);
    }
    align(&table)
}

/// Left-aligned columns separated by three spaces, like cilium-dbg's tables.
/// (Twenty lines; a table crate would not give cilium's continuation lines.)
pub fn align<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < N {
                line.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_golden_output() {
        let counts = [
            DropCount {
                reason: "no-backend",
                direction: "egress",
                packets: 3,
            },
            DropCount {
                reason: "no-service-port",
                direction: "egress",
                packets: 0,
            },
        ];
        let golden = "\
Reason            Direction   Packets
no-backend        egress      3
no-service-port   egress      0
";
        assert_eq!(render_table(&counts), golden);
    }
}
