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
    super::align(&table)
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
