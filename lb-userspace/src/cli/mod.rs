//! lbctl's views: each turns map contents into rows, then a table or JSON.
pub mod backend_list;
pub mod config;
pub mod conntrack;
pub mod drops;
pub mod maglev;
pub mod service_list;
pub mod status;
pub mod top;
pub mod trace;
pub mod version;

/// Output format of every lbctl command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
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
