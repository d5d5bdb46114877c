CREATE TABLE office_day ( -- the simulated current date, read by the triggers
  id INTEGER PRIMARY KEY CHECK (id = 1),
  today TEXT NOT NULL -- YYYY-MM-DD
);

CREATE TABLE zones ( -- parking zones of the city
  zone_code TEXT PRIMARY KEY NOT NULL, -- e.g. Z1
  zone_name TEXT NOT NULL, -- the neighbourhood the zone covers
  monthly_fee REAL NOT NULL CHECK (monthly_fee >= 0) -- price of a resident permit per month, EUR
);

CREATE TABLE residents ( -- residents registered at the desk
  resident_id TEXT PRIMARY KEY NOT NULL, -- e.g. r_ana
  full_name TEXT NOT NULL,
  home_zone TEXT NOT NULL REFERENCES zones(zone_code), -- zone of the resident's address
  is_disabled INTEGER NOT NULL DEFAULT 0 CHECK (is_disabled IN (0, 1)) -- 1 when the resident holds a disability card
);

CREATE TABLE vehicles ( -- cars registered to a resident
  plate TEXT PRIMARY KEY NOT NULL, -- licence plate, e.g. KA-123
  resident_id TEXT NOT NULL REFERENCES residents(resident_id),
  is_electric INTEGER NOT NULL DEFAULT 0 CHECK (is_electric IN (0, 1))
);

CREATE TABLE permits ( -- parking permits (resident permits for a car, visitor permits for guests)
  permit_id INTEGER PRIMARY KEY,
  resident_id TEXT NOT NULL REFERENCES residents(resident_id),
  zone_code TEXT NOT NULL REFERENCES zones(zone_code),
  plate TEXT REFERENCES vehicles(plate), -- the car of a resident permit; empty for visitor permits
  permit_kind TEXT NOT NULL CHECK (permit_kind IN ('resident', 'visitor')),
  valid_from TEXT NOT NULL, -- first day the permit is valid
  valid_until TEXT NOT NULL, -- last day the permit is valid
  permit_status TEXT NOT NULL DEFAULT 'active' CHECK (permit_status IN ('active', 'cancelled'))
);

CREATE TABLE payments ( -- payments made by residents for their permits
  payment_id INTEGER PRIMARY KEY,
  resident_id TEXT NOT NULL REFERENCES residents(resident_id),
  permit_id INTEGER NOT NULL REFERENCES permits(permit_id),
  amount REAL NOT NULL CHECK (amount > 0), -- EUR
  paid_on TEXT -- set to today when the payment is recorded
);

CREATE TRIGGER permits_new
BEFORE INSERT ON permits
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: home_zone_only: permits are issued for the resident''s home zone only')
  WHERE NEW.zone_code IS NOT (SELECT home_zone FROM residents WHERE resident_id = NEW.resident_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: start_not_past: a permit cannot start before today')
  WHERE NEW.valid_from < (SELECT today FROM office_day);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: visitor_monthly_cap: a resident can get at most 3 visitor permits starting in one calendar month')
  WHERE NEW.permit_kind = 'visitor'
    AND (SELECT COUNT(*) FROM permits p
         WHERE p.resident_id = NEW.resident_id AND p.permit_kind = 'visitor' AND p.permit_status = 'active'
           AND strftime('%Y-%m', p.valid_from) = strftime('%Y-%m', NEW.valid_from)) >= 3;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: visitor_length: a visitor permit lasts 1 to 3 days')
  WHERE NEW.permit_kind = 'visitor'
    AND (julianday(NEW.valid_until) - julianday(NEW.valid_from) < 0
         OR julianday(NEW.valid_until) - julianday(NEW.valid_from) > 2);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: resident_permit_car: a resident permit is for one of the resident''s own cars, and a visitor permit for no car')
  WHERE (NEW.permit_kind = 'resident'
         AND (NEW.plate IS NULL OR (SELECT resident_id FROM vehicles WHERE plate = NEW.plate) IS NOT NEW.resident_id))
     OR (NEW.permit_kind = 'visitor' AND NEW.plate IS NOT NULL);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_permit_per_car: a car can hold only one active resident permit')
  WHERE NEW.permit_kind = 'resident'
    AND EXISTS (SELECT 1 FROM permits p WHERE p.plate = NEW.plate AND p.permit_status = 'active');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_permit_active: a new permit is active')
  WHERE NEW.permit_status IS NOT 'active';
END;

CREATE TRIGGER permits_change
BEFORE UPDATE ON permits
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cancelled_final: a cancelled permit cannot change')
  WHERE OLD.permit_status = 'cancelled';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: permit_terms_fixed: the holder, zone, car and kind of a permit never change')
  WHERE NEW.resident_id IS NOT OLD.resident_id OR NEW.zone_code IS NOT OLD.zone_code
     OR NEW.plate IS NOT OLD.plate OR NEW.permit_kind IS NOT OLD.permit_kind;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: extend_only: a permit can only be extended, by at most 31 days past its last day, and never start earlier')
  WHERE NEW.valid_from IS NOT OLD.valid_from
     OR julianday(NEW.valid_until) < julianday(OLD.valid_until)
     OR julianday(NEW.valid_until) - julianday(OLD.valid_until) > 31;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: visitor_length: a visitor permit lasts 1 to 3 days')
  WHERE NEW.permit_kind = 'visitor'
    AND julianday(NEW.valid_until) - julianday(NEW.valid_from) > 2;
END;

CREATE TRIGGER payments_new
BEFORE INSERT ON payments
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: own_permit_payment: a payment is for one of the resident''s own active permits')
  WHERE (SELECT resident_id FROM permits WHERE permit_id = NEW.permit_id) IS NOT NEW.resident_id
     OR (SELECT permit_status FROM permits WHERE permit_id = NEW.permit_id) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: yearly_payment_cap: a resident pays at most 400.00 EUR in one calendar year at the desk')
  WHERE (SELECT COALESCE(SUM(amount), 0) FROM payments
         WHERE resident_id = NEW.resident_id
           AND strftime('%Y', paid_on) = strftime('%Y', (SELECT today FROM office_day))) + NEW.amount > 400;
END;

CREATE TRIGGER payments_after_new
AFTER INSERT ON payments
BEGIN
  -- the payment is dated today
  UPDATE payments SET paid_on = (SELECT today FROM office_day) WHERE payment_id = NEW.payment_id;
END;

CREATE TRIGGER payments_fixed
BEFORE UPDATE OF resident_id, permit_id, amount ON payments
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: payments_final: a recorded payment cannot change')
  WHERE 1;
END;
