#!/bin/sh
# Run once by Patroni on the node that creates the cluster, with a superuser connection
# string: the application's role and database, and the session timeouts the apps cannot
# send through PgBouncer (Stockade's defaults: STOCKADE_STATEMENT_TIMEOUT_MS and
# STOCKADE_IDLE_IN_TX_TIMEOUT_MS).
set -eu
psql "$1" -v ON_ERROR_STOP=1 \
  -c "create role stockade login password 'stockade'" \
  -c "grant pg_monitor to stockade" \
  -c "create database stockade owner stockade" \
  -c "alter role stockade in database stockade set statement_timeout = 1500" \
  -c "alter role stockade in database stockade set lock_timeout = 1500" \
  -c "alter role stockade in database stockade set idle_in_transaction_session_timeout = 500"
