CREATE TABLE clock ( -- the simulated current date, read by the triggers
  clock_id INTEGER PRIMARY KEY CHECK (clock_id = 1),
  today TEXT NOT NULL -- YYYY-MM-DD
);

CREATE TABLE customer ( -- the bank's customers
  customer_id TEXT PRIMARY KEY NOT NULL, -- e.g. C-1001
  name TEXT NOT NULL,
  phone TEXT,
  address TEXT NOT NULL,
  kyc_status TEXT NOT NULL DEFAULT 'pending' CHECK (kyc_status IN ('verified', 'pending')), -- identity check status, set by compliance
  risk_tier TEXT NOT NULL DEFAULT 'medium' CHECK (risk_tier IN ('low', 'medium', 'high')) -- set by compliance
);

CREATE TABLE account ( -- checking and savings accounts
  account_id TEXT PRIMARY KEY NOT NULL, -- e.g. ACC-30021
  customer_id TEXT NOT NULL REFERENCES customer(customer_id), -- the account owner
  type TEXT NOT NULL CHECK (type IN ('checking', 'savings')),
  balance REAL NOT NULL DEFAULT 0, -- current balance in USD (negative when overdrawn)
  overdraft_limit REAL NOT NULL DEFAULT 0 CHECK (overdraft_limit >= 0), -- how far below zero the balance may go
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'frozen', 'closed')),
  opened_on DATE -- set by the core system
);

CREATE TABLE card ( -- debit cards, each linked to one account
  card_id TEXT PRIMARY KEY NOT NULL, -- e.g. CRD-5501
  account_id TEXT NOT NULL REFERENCES account(account_id),
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'blocked', 'reported_lost')),
  daily_limit REAL NOT NULL CHECK (daily_limit > 0) -- daily spending limit in USD
);

CREATE TABLE payee ( -- a customer's saved beneficiaries (accounts of the bank)
  payee_id INTEGER PRIMARY KEY,
  customer_id TEXT NOT NULL REFERENCES customer(customer_id), -- the customer who saved the payee
  account_id TEXT NOT NULL REFERENCES account(account_id), -- the beneficiary's account
  nickname TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'removed')),
  UNIQUE (customer_id, account_id)
);

CREATE TABLE transfer ( -- money moved between two accounts of the bank
  transfer_id INTEGER PRIMARY KEY,
  from_account TEXT NOT NULL REFERENCES account(account_id), -- the sending account
  to_account TEXT NOT NULL REFERENCES account(account_id), -- the receiving account
  amount REAL NOT NULL CHECK (amount > 0), -- USD
  transfer_date DATE, -- set to today when the transfer is made
  status TEXT NOT NULL DEFAULT 'completed' CHECK (status IN ('completed', 'reversed')),
  memo TEXT,
  CHECK (to_account <> from_account)
);

-- Transfers: a looked-up cell, a SUM over today's rows, EXISTS, a CASE on a joined column,
-- a COUNT per calendar month

CREATE TRIGGER transfer_new_rules
BEFORE INSERT ON transfer
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: transfer_reversal: new transfers are recorded as completed')
  WHERE NEW.status IS NOT 'completed';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: active_accounts_only: both the sending and the receiving account must be active')
  WHERE (SELECT status FROM account WHERE account_id = NEW.from_account) IS NOT 'active'
     OR (SELECT status FROM account WHERE account_id = NEW.to_account) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: known_recipient: money can only go to the customer''s own account or an active saved payee')
  WHERE NOT EXISTS (SELECT 1 FROM account f JOIN account t ON t.customer_id = f.customer_id
                    WHERE f.account_id = NEW.from_account AND t.account_id = NEW.to_account)
    AND NOT EXISTS (SELECT 1 FROM account f JOIN payee p ON p.customer_id = f.customer_id
                    WHERE f.account_id = NEW.from_account
                      AND p.account_id = NEW.to_account AND p.status = 'active');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: sufficient_funds: the balance plus the overdraft limit must cover the transfer')
  WHERE NEW.amount > (SELECT balance + overdraft_limit FROM account WHERE account_id = NEW.from_account);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: daily_transfer_limit: an account can send at most 2000.00 per day')
  WHERE (SELECT COALESCE(SUM(t.amount), 0) FROM transfer t
         WHERE t.from_account = NEW.from_account AND t.status = 'completed'
           AND t.transfer_date = (SELECT today FROM clock)) + NEW.amount > 2000;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: kyc_pending_limit: a customer with pending KYC cannot send more than 500.00 in one transfer')
  WHERE (SELECT CASE c.kyc_status WHEN 'pending' THEN NEW.amount > 500 ELSE 0 END
         FROM account a JOIN customer c ON c.customer_id = a.customer_id
         WHERE a.account_id = NEW.from_account) = 1;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: savings_monthly_limit: a savings account can make at most 6 outgoing transfers per calendar month')
  WHERE (SELECT type FROM account WHERE account_id = NEW.from_account) = 'savings'
    AND (SELECT COUNT(*) FROM transfer t
         WHERE t.from_account = NEW.from_account AND t.status = 'completed'
           AND strftime('%Y-%m', t.transfer_date) = strftime('%Y-%m', (SELECT today FROM clock))) >= 6;
END;

CREATE TRIGGER transfer_after_new
AFTER INSERT ON transfer
WHEN NEW.status = 'completed'
BEGIN
  -- the amount is debited from the sending account, credited to the receiving account, and the transfer is dated today
  UPDATE account SET balance = balance - NEW.amount WHERE account_id = NEW.from_account;
  UPDATE account SET balance = balance + NEW.amount WHERE account_id = NEW.to_account;
  UPDATE transfer SET transfer_date = (SELECT today FROM clock) WHERE transfer_id = NEW.transfer_id;
END;

CREATE TRIGGER transfer_change_rules
BEFORE UPDATE OF from_account, to_account, amount, status ON transfer
WHEN NEW.from_account IS NOT OLD.from_account OR NEW.to_account IS NOT OLD.to_account
  OR NEW.amount IS NOT OLD.amount OR NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: transfer_reversal: only a completed transfer made today can be reversed, and nothing else about a transfer can change')
  WHERE NOT (OLD.status = 'completed' AND NEW.status = 'reversed'
             AND NEW.from_account IS OLD.from_account AND NEW.to_account IS OLD.to_account
             AND NEW.amount IS OLD.amount
             AND OLD.transfer_date = (SELECT today FROM clock));
END;

CREATE TRIGGER transfer_after_reversal
AFTER UPDATE OF status ON transfer
WHEN OLD.status = 'completed' AND NEW.status = 'reversed'
BEGIN
  -- the money goes back: the sending account is credited and the receiving account debited
  UPDATE account SET balance = balance + OLD.amount WHERE account_id = OLD.from_account;
  UPDATE account SET balance = balance - OLD.amount WHERE account_id = OLD.to_account;
END;

-- Accounts: status transitions and immutable columns

CREATE TRIGGER account_closed_final
BEFORE UPDATE ON account
WHEN OLD.status = 'closed'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: closed_is_final: a closed account cannot be reopened or changed');
END;

CREATE TRIGGER account_owner_fixed
BEFORE UPDATE OF customer_id, type ON account
WHEN NEW.customer_id IS NOT OLD.customer_id OR NEW.type IS NOT OLD.type
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: account_owner_fixed: the owner and the type of an account never change');
END;

CREATE TRIGGER account_close_rules
BEFORE UPDATE OF status ON account
WHEN NEW.status = 'closed' AND OLD.status IS NOT 'closed'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: close_zero_balance: an account can be closed only with a balance of exactly 0.00')
  WHERE round(NEW.balance, 2) <> 0;
END;

CREATE TRIGGER account_after_new
AFTER INSERT ON account
BEGIN
  -- the opening date is set to today
  UPDATE account SET opened_on = (SELECT today FROM clock) WHERE account_id = NEW.account_id;
END;

CREATE TRIGGER account_after_freeze
AFTER UPDATE OF status ON account
WHEN NEW.status IN ('frozen', 'closed') AND OLD.status = 'active'
BEGIN
  -- when the account is frozen or closed, its active cards are blocked
  UPDATE card SET status = 'blocked' WHERE account_id = NEW.account_id AND status = 'active';
END;

CREATE TRIGGER account_after_close
AFTER UPDATE OF status ON account
WHEN NEW.status = 'closed' AND OLD.status IS NOT 'closed'
BEGIN
  -- when the account is closed, every saved payee pointing at it is removed
  UPDATE payee SET status = 'removed' WHERE account_id = NEW.account_id AND status = 'active';
END;

-- Cards

CREATE TRIGGER card_lost_final
BEFORE UPDATE OF status ON card
WHEN OLD.status = 'reported_lost' AND NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: lost_card_final: a card reported lost can never be reactivated or unblocked');
END;

CREATE TRIGGER card_new_limit
BEFORE INSERT ON card
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: card_limit_by_tier: the daily limit cannot exceed 5000.00 for low, 2500.00 for medium and 1000.00 for high risk customers')
  WHERE NEW.daily_limit > (SELECT CASE c.risk_tier WHEN 'low' THEN 5000 WHEN 'medium' THEN 2500 ELSE 1000 END
                           FROM account a JOIN customer c ON c.customer_id = a.customer_id
                           WHERE a.account_id = NEW.account_id);
END;

CREATE TRIGGER card_limit_change
BEFORE UPDATE OF daily_limit, account_id ON card
WHEN NEW.daily_limit IS NOT OLD.daily_limit OR NEW.account_id IS NOT OLD.account_id
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: card_limit_by_tier: the daily limit cannot exceed 5000.00 for low, 2500.00 for medium and 1000.00 for high risk customers')
  WHERE NEW.daily_limit > (SELECT CASE c.risk_tier WHEN 'low' THEN 5000 WHEN 'medium' THEN 2500 ELSE 1000 END
                           FROM account a JOIN customer c ON c.customer_id = a.customer_id
                           WHERE a.account_id = NEW.account_id);
END;
