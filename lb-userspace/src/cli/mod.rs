//! lbctl's views: each turns map contents into rows, then a table or JSON.
pub mod backend_list;
pub mod config;
pub mod conntrack;
pub mod drops;
pub mod maglev;
pub mod service_list;
pub mod status;

/// Output format of every lbctl command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
}
