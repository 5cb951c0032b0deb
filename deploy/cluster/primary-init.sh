#!/bin/sh
# First start of the cluster profile's primary: let the replica stream from it, and give
# the application role the session timeouts it cannot send through PgBouncer (the values
# are Stockade's defaults: STOCKADE_STATEMENT_TIMEOUT_MS and STOCKADE_IDLE_IN_TX_TIMEOUT_MS).
set -e
echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" <<SQL
alter role $POSTGRES_USER in database $POSTGRES_DB set statement_timeout = 1500;
alter role $POSTGRES_USER in database $POSTGRES_DB set lock_timeout = 1500;
alter role $POSTGRES_USER in database $POSTGRES_DB set idle_in_transaction_session_timeout = 500;
SQL
