-- Riverside Water customer service desk: tables (static constraints) then triggers (the policy).
-- A comment on a CREATE TABLE line documents the table; trailing comments document columns.

CREATE TABLE clock ( -- the simulated current date read by the triggers
  clock_id INTEGER PRIMARY KEY CHECK (clock_id = 1),
  today TEXT NOT NULL -- YYYY-MM-DD
);

CREATE TABLE account ( -- customer accounts of the water utility
  account_id TEXT PRIMARY KEY NOT NULL, -- e.g. ACC-1001
  holder_name TEXT NOT NULL, -- full name of the account holder
  phone TEXT, -- contact phone number of the account holder
  email TEXT, -- contact email address of the account holder
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended', 'closed')),
  opened_on DATE NOT NULL CHECK (date(opened_on) IS opened_on) -- date the account was opened
);

CREATE TABLE premise ( -- service addresses where an account receives water
  address_id TEXT PRIMARY KEY NOT NULL, -- e.g. P-11
  account_id TEXT NOT NULL REFERENCES account(account_id),
  street TEXT NOT NULL, -- street address with house number
  unit TEXT, -- apartment or unit number
  zip TEXT NOT NULL, -- postal code
  service_on BOOLEAN NOT NULL DEFAULT 1 -- 1 for water service currently turned on
);

CREATE TABLE meter ( -- water meters installed at service addresses
  meter_id TEXT PRIMARY KEY NOT NULL, -- e.g. M-5501
  address_id TEXT NOT NULL REFERENCES premise(address_id),
  size_inches REAL NOT NULL CHECK (size_inches > 0), -- pipe size of the meter in inches
  installed_on DATE NOT NULL CHECK (date(installed_on) IS installed_on), -- date the meter was installed
  last_reading INTEGER NOT NULL CHECK (last_reading >= 0) -- latest meter reading in cubic feet
);

CREATE TABLE bill ( -- monthly water bills issued by the billing system
  bill_id TEXT PRIMARY KEY NOT NULL, -- e.g. B-2502-1001
  account_id TEXT NOT NULL REFERENCES account(account_id),
  period TEXT NOT NULL, -- billing month YYYY-MM
  usage_ccf REAL NOT NULL CHECK (usage_ccf >= 0), -- water used in hundreds of cubic feet
  amount REAL NOT NULL CHECK (amount > 0), -- bill amount in USD
  amount_paid REAL NOT NULL DEFAULT 0 CHECK (amount_paid >= 0), -- amount paid so far in USD
  due_date DATE NOT NULL CHECK (date(due_date) IS due_date), -- date the bill must be paid by
  status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'paid'))
);

CREATE TABLE payment ( -- payments received on bills
  payment_id INTEGER PRIMARY KEY,
  account_id TEXT NOT NULL REFERENCES account(account_id),
  bill_id TEXT NOT NULL REFERENCES bill(bill_id),
  amount REAL NOT NULL CHECK (amount > 0), -- amount paid in USD
  method TEXT NOT NULL CHECK (method IN ('card', 'bank_transfer', 'check', 'cash')),
  paid_on DATE -- date the payment was received
);

CREATE TABLE payment_plan ( -- installment plans spreading the unpaid amount of one bill
  plan_id TEXT PRIMARY KEY NOT NULL, -- e.g. PP-301
  account_id TEXT NOT NULL REFERENCES account(account_id),
  bill_id TEXT NOT NULL REFERENCES bill(bill_id),
  installments INTEGER NOT NULL, -- number of monthly installments
  installment_amount REAL, -- amount of each monthly installment in USD
  first_due DATE NOT NULL CHECK (date(first_due) IS first_due), -- due date of the first installment
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'completed', 'cancelled'))
);

CREATE TABLE service_request ( -- field service requests filed at the desk
  request_id TEXT PRIMARY KEY NOT NULL, -- e.g. SR-7001
  account_id TEXT NOT NULL REFERENCES account(account_id),
  address_id TEXT NOT NULL REFERENCES premise(address_id),
  meter_id TEXT REFERENCES meter(meter_id), -- meter to be tested; null unless the request is a meter test
  kind TEXT NOT NULL CHECK (kind IN ('start_service', 'stop_service', 'leak_inspection', 'meter_test', 'shutoff')),
  requested_on DATE, -- date the request was filed
  scheduled_date DATE NOT NULL CHECK (date(scheduled_date) IS scheduled_date), -- day the crew does the work
  status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'scheduled', 'completed', 'cancelled')),
  notes TEXT -- free-text remarks for the field crew
);

CREATE TABLE medical_hold ( -- doctor-certified holds that protect a household from a shutoff
  hold_id TEXT PRIMARY KEY NOT NULL, -- e.g. MH-41
  account_id TEXT NOT NULL REFERENCES account(account_id),
  start_date DATE NOT NULL CHECK (date(start_date) IS start_date), -- first day the hold protects
  end_date DATE NOT NULL CHECK (date(end_date) IS end_date), -- last day the hold protects
  certified_by TEXT NOT NULL, -- name of the doctor who certified the hold
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'ended'))
);

-- ============================================================================ accounts

CREATE TRIGGER account_closed_final
BEFORE UPDATE ON account
WHEN OLD.status = 'closed'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: closed_account_final: a closed account cannot be reopened or changed');
END;

CREATE TRIGGER account_closure_rules
BEFORE UPDATE OF status ON account
WHEN NEW.status = 'closed' AND OLD.status IS NOT 'closed'
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: account_closure_balance: an account can be closed only when none of its bills has an unpaid amount left')
  WHERE EXISTS (SELECT 1 FROM bill b
                WHERE b.account_id = OLD.account_id AND b.amount_paid < b.amount);
END;

-- ============================================================================ payments

CREATE TRIGGER payment_insert_rules
BEFORE INSERT ON payment
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: bill_same_account: a payment must be for a bill of the same account')
  WHERE (SELECT account_id FROM bill WHERE bill_id = NEW.bill_id) IS NOT NEW.account_id;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: card_payment_limit: a single card payment is at most 1000.00')
  WHERE NEW.method = 'card' AND NEW.amount > 1000;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: bill_payment_total: the payments on a bill, this one included, must not exceed the bill amount')
  WHERE (SELECT COALESCE(SUM(p.amount), 0) FROM payment p WHERE p.bill_id = NEW.bill_id) + NEW.amount
        > (SELECT amount FROM bill WHERE bill_id = NEW.bill_id) + 0.005;
END;

CREATE TRIGGER payment_after_insert
AFTER INSERT ON payment
BEGIN
  -- the payment date is set to today, the bill's paid amount goes up by the payment and the bill becomes paid once fully paid
  UPDATE payment SET paid_on = (SELECT today FROM clock) WHERE payment_id = NEW.payment_id;
  UPDATE bill SET amount_paid = ROUND(amount_paid + NEW.amount, 2) WHERE bill_id = NEW.bill_id;
  UPDATE bill SET status = 'paid' WHERE bill_id = NEW.bill_id AND amount_paid >= amount - 0.005;
END;

-- ============================================================================ payment plans

CREATE TRIGGER plan_insert_rules
BEFORE INSERT ON payment_plan
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: bill_same_account: a payment plan must be for a bill of the same account')
  WHERE (SELECT account_id FROM bill WHERE bill_id = NEW.bill_id) IS NOT NEW.account_id;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: plan_installments: a payment plan has at least 2 and at most 12 installments')
  WHERE NEW.installments < 2 OR NEW.installments > 12;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_active_plan: an account can have at most 1 active payment plan')
  WHERE NEW.status = 'active'
    AND EXISTS (SELECT 1 FROM payment_plan pp
                WHERE pp.account_id = NEW.account_id AND pp.status = 'active');
END;

CREATE TRIGGER plan_update_rules
BEFORE UPDATE OF account_id, bill_id, installments, status ON payment_plan
WHEN NEW.account_id IS NOT OLD.account_id OR NEW.bill_id IS NOT OLD.bill_id
  OR NEW.installments IS NOT OLD.installments OR NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: bill_same_account: a payment plan must be for a bill of the same account')
  WHERE (SELECT account_id FROM bill WHERE bill_id = NEW.bill_id) IS NOT NEW.account_id;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: plan_installments: a payment plan has at least 2 and at most 12 installments')
  WHERE NEW.installments < 2 OR NEW.installments > 12;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_active_plan: an account can have at most 1 active payment plan')
  WHERE NEW.status = 'active'
    AND (OLD.status IS NOT 'active' OR NEW.account_id IS NOT OLD.account_id)
    AND EXISTS (SELECT 1 FROM payment_plan pp
                WHERE pp.account_id = NEW.account_id AND pp.status = 'active'
                  AND pp.plan_id <> NEW.plan_id);
END;

CREATE TRIGGER plan_after_write
AFTER INSERT ON payment_plan
BEGIN
  -- the installment amount is computed: what is still unpaid on the bill divided by the number of installments
  UPDATE payment_plan
  SET installment_amount = (SELECT ROUND((b.amount - b.amount_paid) / NEW.installments, 2)
                            FROM bill b WHERE b.bill_id = NEW.bill_id)
  WHERE plan_id = NEW.plan_id;
END;

CREATE TRIGGER plan_after_change
AFTER UPDATE OF bill_id, installments ON payment_plan
WHEN NEW.bill_id IS NOT OLD.bill_id OR NEW.installments IS NOT OLD.installments
BEGIN
  -- the installment amount is recomputed from what is still unpaid on the bill and the new number of installments
  UPDATE payment_plan
  SET installment_amount = (SELECT ROUND((b.amount - b.amount_paid) / NEW.installments, 2)
                            FROM bill b WHERE b.bill_id = NEW.bill_id)
  WHERE plan_id = NEW.plan_id;
END;

-- ============================================================================ service requests

CREATE TRIGGER request_insert_rules
BEFORE INSERT ON service_request
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: request_status_flow: a new request is created with status open')
  WHERE NEW.status IS NOT 'open';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: request_account_open: closed accounts cannot file new service requests')
  WHERE (SELECT status FROM account WHERE account_id = NEW.account_id) = 'closed';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: open_request_cap: an account can have at most 3 open or scheduled service requests')
  WHERE NEW.status IN ('open', 'scheduled')
    AND (SELECT COUNT(*) FROM service_request r
         WHERE r.account_id = NEW.account_id AND r.status IN ('open', 'scheduled')) >= 3;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: stop_notice: a stop-service request must be scheduled at least 2 days after today')
  WHERE NEW.kind = 'stop_service'
    AND julianday(NEW.scheduled_date) - julianday((SELECT today FROM clock)) < 2;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: meter_test_yearly_cap: a meter can have at most 3 meter tests scheduled in the same calendar year')
  WHERE NEW.kind = 'meter_test' AND NEW.status IS NOT 'cancelled'
    AND (SELECT COUNT(*) FROM service_request r
         WHERE r.meter_id = NEW.meter_id AND r.kind = 'meter_test' AND r.status <> 'cancelled'
           AND strftime('%Y', r.scheduled_date) = strftime('%Y', NEW.scheduled_date)) >= 3;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: shutoff_medical_hold: no shutoff can be scheduled on a day covered by an active medical hold')
  WHERE NEW.kind = 'shutoff'
    AND EXISTS (SELECT 1 FROM medical_hold h
                WHERE h.account_id = NEW.account_id AND h.status = 'active'
                  AND NEW.scheduled_date BETWEEN h.start_date AND h.end_date);
END;

CREATE TRIGGER request_after_insert
AFTER INSERT ON service_request
BEGIN
  -- the request date is set to today
  UPDATE service_request SET requested_on = (SELECT today FROM clock) WHERE request_id = NEW.request_id;
END;

CREATE TRIGGER request_final
BEFORE UPDATE OF account_id, address_id, meter_id, kind, scheduled_date, status, notes ON service_request
WHEN OLD.status IN ('completed', 'cancelled')
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: request_final: completed and cancelled requests cannot be changed');
END;

CREATE TRIGGER request_details_fixed
BEFORE UPDATE OF account_id, address_id, meter_id, kind ON service_request
WHEN NEW.account_id IS NOT OLD.account_id OR NEW.address_id IS NOT OLD.address_id
  OR NEW.meter_id IS NOT OLD.meter_id OR NEW.kind IS NOT OLD.kind
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: request_details_fixed: the account, address, meter and kind of a request cannot change');
END;

CREATE TRIGGER request_status_change
BEFORE UPDATE OF status ON service_request
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: request_status_flow: a request goes open -> scheduled or cancelled, and scheduled -> completed or cancelled')
  WHERE NOT ((OLD.status = 'open' AND NEW.status IN ('scheduled', 'cancelled'))
          OR (OLD.status = 'scheduled' AND NEW.status IN ('completed', 'cancelled')));
END;

CREATE TRIGGER request_reschedule
BEFORE UPDATE OF scheduled_date ON service_request
WHEN NEW.scheduled_date IS NOT OLD.scheduled_date
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: stop_notice: a stop-service request must be scheduled at least 2 days after today')
  WHERE NEW.kind = 'stop_service'
    AND julianday(NEW.scheduled_date) - julianday((SELECT today FROM clock)) < 2;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: meter_test_yearly_cap: a meter can have at most 3 meter tests scheduled in the same calendar year')
  WHERE NEW.kind = 'meter_test' AND NEW.status IS NOT 'cancelled'
    AND (SELECT COUNT(*) FROM service_request r
         WHERE r.meter_id = NEW.meter_id AND r.kind = 'meter_test' AND r.status <> 'cancelled'
           AND r.request_id <> NEW.request_id
           AND strftime('%Y', r.scheduled_date) = strftime('%Y', NEW.scheduled_date)) >= 3;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: shutoff_medical_hold: no shutoff can be scheduled on a day covered by an active medical hold')
  WHERE NEW.kind = 'shutoff'
    AND EXISTS (SELECT 1 FROM medical_hold h
                WHERE h.account_id = NEW.account_id AND h.status = 'active'
                  AND NEW.scheduled_date BETWEEN h.start_date AND h.end_date);
END;

CREATE TRIGGER request_after_complete
AFTER UPDATE OF status ON service_request
WHEN NEW.status = 'completed' AND OLD.status = 'scheduled'
BEGIN
  -- start_service turns the water on at the address; stop_service and shutoff turn it off; a shutoff also suspends an active account
  UPDATE premise SET service_on = 1
  WHERE address_id = NEW.address_id AND NEW.kind = 'start_service';
  UPDATE premise SET service_on = 0
  WHERE address_id = NEW.address_id AND NEW.kind IN ('stop_service', 'shutoff');
  UPDATE account SET status = 'suspended'
  WHERE account_id = NEW.account_id AND NEW.kind = 'shutoff' AND status = 'active';
END;

-- ============================================================================ medical holds

CREATE TRIGGER hold_insert_rules
BEFORE INSERT ON medical_hold
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: medical_hold_length: a medical hold ends after it starts and lasts at most 90 days')
  WHERE julianday(NEW.end_date) - julianday(NEW.start_date) NOT BETWEEN 1 AND 90;
END;

CREATE TRIGGER hold_update_rules
BEFORE UPDATE OF start_date, end_date ON medical_hold
WHEN NEW.start_date IS NOT OLD.start_date OR NEW.end_date IS NOT OLD.end_date
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: medical_hold_length: a medical hold ends after it starts and lasts at most 90 days')
  WHERE julianday(NEW.end_date) - julianday(NEW.start_date) NOT BETWEEN 1 AND 90;
END;
