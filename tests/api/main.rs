//! Integration tests: one binary, real PostgreSQL, Redis and Chromium, started by
//! [`helpers`].

mod admin;
mod answers;
mod audit_search;
mod backups;
mod bench;
mod browse;
mod browser;
mod carts;
mod catalogue;
mod checks;
mod children;
mod clients;
mod cluster;
mod drops;
mod edges;
mod events;
mod faults;
mod health;
mod helpers;
mod hoarding;
mod holds;
mod images;
mod ledger;
mod limits;
pub(crate) mod loadtest;
mod openapi;
mod orders;
mod payments;
mod plans;
mod process;
mod retention;
mod security;
mod shop;
mod webhooks;
mod zone;
