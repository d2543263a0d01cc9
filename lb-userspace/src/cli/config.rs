//! `lbctl config get|set`: the programs' run-time settings.
use crate::datapath::config::{format_value, Setting};

pub fn render_table(all: &[(&'static Setting, u32)]) -> String {
    let mut t = vec![["Setting".to_string(), "Value".into(), "Meaning".into()]];
    for (s, v) in all {
        t.push([s.name.to_string(), format_value(s, *v), s.help.to_string()]);
    }
    super::align(&t)
}

pub fn to_json(all: &[(&'static Setting, u32)]) -> serde_json::Value {
    serde_json::Value::Object(
        all.iter()
            .map(|(s, v)| (s.name.to_string(), format_value(s, *v).into()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::config::SETTINGS;

    #[test]
    fn table_matches_golden_output() {
        let all: Vec<_> = SETTINGS.iter().zip([4, 1, 1000, 0]).collect();
        let golden = "\
Setting               Value   Meaning
bpf-log-level         debug   aya-log level of the programs: off, error, warn, info, debug, trace
trace                 on      trace events for every translation: on or off
event-rate            1000    events per second per CPU before rate limiting
host-namespace-only   off     translate only sockets of the host network namespace: on or off
";
        assert_eq!(render_table(&all), golden);
        assert_eq!(to_json(&all)["bpf-log-level"], "debug");
    }
}
