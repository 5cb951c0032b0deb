//! Integration tests: one binary, real PostgreSQL, Redis and Chromium, started by
//! [`helpers`].

mod admin;
mod audit_search;
mod bench;
mod browse;
mod browser;
mod carts;
mod catalogue;
mod clients;
mod cluster;
mod edges;
mod events;
mod faults;
mod health;
mod helpers;
mod holds;
mod images;
mod limits;
mod loadtest;
mod openapi;
mod orders;
mod plans;
mod process;
mod security;
mod shop;
mod webhooks;
