-- Failed logins are counted per (account, client address) ('pair', subject
-- "<sha256 of the account>/<address>") and per address ('client'), no longer per account
-- alone, so guessing from one address cannot lock an account for everyone. Old 'account'
-- rows are left to lapse.
alter table login_failures drop constraint login_failures_kind_check;
alter table login_failures
    add constraint login_failures_kind_check check (kind in ('account', 'client', 'pair'));
