-- Brookhaven residents' parking permits: tables (static constraints), then the triggers that
-- enforce the desk policy (policy.md). Amounts are EUR with two decimals; dates are YYYY-MM-DD.

CREATE TABLE desk_calendar ( -- the simulated business date of the desk (one row), read by the triggers
  calendar_id INTEGER PRIMARY KEY CHECK (calendar_id = 1),
  business_date TEXT NOT NULL -- today, YYYY-MM-DD
);

CREATE TABLE zone ( -- residential parking zones of the city and their tariffs
  zone_code TEXT PRIMARY KEY NOT NULL, -- e.g. Z3
  zone_name TEXT NOT NULL, -- neighbourhood name, e.g. Old Harbour
  annual_fee REAL NOT NULL CHECK (annual_fee > 0), -- EUR, price of a resident permit (up to one year)
  visitor_day_rate REAL NOT NULL CHECK (visitor_day_rate > 0) -- EUR per day of a visitor permit
);

CREATE TABLE resident ( -- people registered at an address in a parking zone
  resident_id TEXT PRIMARY KEY NOT NULL, -- e.g. R-0412
  full_name TEXT NOT NULL,
  street_address TEXT NOT NULL, -- home address, e.g. 14 Quay Street
  zone_code TEXT NOT NULL REFERENCES zone(zone_code), -- the resident's home zone
  date_of_birth TEXT NOT NULL, -- YYYY-MM-DD
  is_senior BOOLEAN NOT NULL DEFAULT 0, -- 1 when aged 65 or more: resident permits at half price
  has_blue_badge BOOLEAN NOT NULL DEFAULT 0, -- 1 when holding a disability badge: 3 resident permits allowed instead of 2
  email TEXT,
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'moved_out')) -- moved_out residents get no permits
);

CREATE TABLE vehicle ( -- vehicles registered to residents, by number plate
  plate TEXT PRIMARY KEY NOT NULL, -- number plate, e.g. KX-482-LM
  resident_id TEXT NOT NULL REFERENCES resident(resident_id), -- registered keeper
  make TEXT NOT NULL, -- e.g. Toyota
  model TEXT NOT NULL, -- e.g. Yaris
  colour TEXT NOT NULL, -- e.g. silver
  fuel TEXT NOT NULL CHECK (fuel IN ('petrol', 'diesel', 'hybrid', 'electric')),
  is_commercial BOOLEAN NOT NULL DEFAULT 0 -- 1 for vans and work vehicles: no resident permit
);

CREATE TABLE permit ( -- parking permits: one plate, one zone, a period of days
  permit_id TEXT PRIMARY KEY NOT NULL, -- e.g. P-2025-0012
  resident_id TEXT NOT NULL REFERENCES resident(resident_id), -- the applicant (for a visitor permit: the resident being visited)
  kind TEXT NOT NULL CHECK (kind IN ('resident', 'visitor')), -- resident: the resident's own car; visitor: a visiting car
  plate TEXT NOT NULL, -- number plate the permit is for (a visitor's plate need not be registered in the city)
  zone_code TEXT NOT NULL REFERENCES zone(zone_code), -- zone where the permit is valid
  valid_from TEXT NOT NULL CHECK (date(valid_from) IS valid_from), -- first day, YYYY-MM-DD
  valid_to TEXT NOT NULL CHECK (date(valid_to) IS valid_to), -- last day included, YYYY-MM-DD
  fee REAL, -- EUR, computed by the system when the permit is created
  amount_paid REAL NOT NULL DEFAULT 0, -- EUR received so far (sum of payments)
  status TEXT NOT NULL DEFAULT 'pending_payment'
    CHECK (status IN ('pending_payment', 'active', 'suspended', 'cancelled', 'expired')),
  issued_on TEXT -- date the permit was created, set by the system
);

CREATE TABLE payment ( -- payments received for permits (never changed afterwards)
  payment_id INTEGER PRIMARY KEY,
  permit_id TEXT NOT NULL REFERENCES permit(permit_id),
  amount REAL NOT NULL CHECK (amount > 0), -- EUR
  method TEXT NOT NULL CHECK (method IN ('card', 'cash', 'direct_debit')),
  paid_on TEXT -- date received, set by the system to today
);

CREATE TABLE fine ( -- penalty charge notices issued to plates by the wardens
  pcn_id TEXT PRIMARY KEY NOT NULL, -- e.g. PCN-88123
  plate TEXT NOT NULL, -- plate the fine was issued to
  issued_on TEXT NOT NULL, -- YYYY-MM-DD
  amount REAL NOT NULL CHECK (amount > 0), -- EUR
  reason TEXT NOT NULL, -- e.g. no valid permit displayed
  status TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'appealed', 'paid', 'cancelled')) -- open = unpaid
);

-- ============================================================================ new permits

CREATE TRIGGER permit_insert_rules
BEFORE INSERT ON permit
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_permit_pending: new permits are created with status pending_payment')
  WHERE NEW.status IS NOT 'pending_payment';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: resident_active: only active residents can be issued permits')
  WHERE (SELECT status FROM resident WHERE resident_id = NEW.resident_id) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: home_zone_only: a permit is only valid in the resident''s home zone')
  WHERE NEW.zone_code IS NOT (SELECT zone_code FROM resident WHERE resident_id = NEW.resident_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: own_vehicle: a resident permit is only for a non-commercial vehicle registered to the resident')
  WHERE NEW.kind = 'resident'
    AND NOT EXISTS (SELECT 1 FROM vehicle v
                    WHERE v.plate = NEW.plate AND v.resident_id = NEW.resident_id AND v.is_commercial = 0);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: visitor_not_own_car: a visitor permit cannot be for a vehicle registered to the resident')
  WHERE NEW.kind = 'visitor'
    AND EXISTS (SELECT 1 FROM vehicle v WHERE v.plate = NEW.plate AND v.resident_id = NEW.resident_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: unpaid_fines_block: the resident has more than 60.00 EUR of open fines on their vehicles')
  WHERE (SELECT COALESCE(SUM(f.amount), 0)
         FROM fine f JOIN vehicle v ON v.plate = f.plate
         WHERE v.resident_id = NEW.resident_id AND f.status = 'open') > 60;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: permit_terms: a permit starts today or later, ends on or after its start, and lasts at most 3 days (visitor) or 365 days (resident)')
  WHERE NEW.valid_from < (SELECT business_date FROM desk_calendar)
     OR NEW.valid_to < NEW.valid_from
     OR julianday(NEW.valid_to) - julianday(NEW.valid_from) + 1
        > CASE NEW.kind WHEN 'visitor' THEN 3 ELSE 365 END;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: visitor_monthly_cap: at most 3 visitor permits per resident starting in the same calendar month')
  WHERE NEW.kind = 'visitor'
    AND (SELECT COUNT(*) FROM permit p
         WHERE p.resident_id = NEW.resident_id AND p.kind = 'visitor' AND p.status <> 'cancelled'
           AND strftime('%Y-%m', p.valid_from) = strftime('%Y-%m', NEW.valid_from)) >= 3;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: household_cap: a resident holds at most 2 resident permits at a time (3 with a blue badge)')
  WHERE NEW.kind = 'resident'
    AND (SELECT COUNT(*) FROM permit p
         WHERE p.resident_id = NEW.resident_id AND p.kind = 'resident'
           AND p.status IN ('pending_payment', 'active', 'suspended'))
        >= (SELECT CASE WHEN has_blue_badge = 1 THEN 3 ELSE 2 END
            FROM resident WHERE resident_id = NEW.resident_id);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_permit_per_plate: this plate already holds a permit for an overlapping period')
  WHERE EXISTS (SELECT 1 FROM permit p
                WHERE p.plate = NEW.plate AND p.status <> 'cancelled'
                  AND p.valid_from <= NEW.valid_to AND NEW.valid_from <= p.valid_to);
END;

CREATE TRIGGER permit_after_insert
AFTER INSERT ON permit
BEGIN
  -- The fee is computed (visitor: days x the zone's visitor day rate; resident: the zone's annual fee, half price for seniors), amount_paid starts at 0 and issued_on is set to today
  UPDATE permit
  SET fee = (SELECT CASE
                      WHEN NEW.kind = 'visitor'
                        THEN round((julianday(NEW.valid_to) - julianday(NEW.valid_from) + 1) * z.visitor_day_rate, 2)
                      WHEN r.is_senior = 1 THEN round(z.annual_fee * 0.5, 2)
                      ELSE z.annual_fee
                    END
             FROM zone z, resident r
             WHERE z.zone_code = NEW.zone_code AND r.resident_id = NEW.resident_id),
      amount_paid = 0,
      issued_on = (SELECT business_date FROM desk_calendar)
  WHERE permit_id = NEW.permit_id;
END;

-- ============================================================================ permit changes

CREATE TRIGGER permit_terms_fixed
BEFORE UPDATE OF resident_id, kind, plate, zone_code, valid_from, valid_to ON permit
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: permit_terms: the holder, kind, plate, zone and period of a permit cannot change; cancel it and apply for a new one')
  WHERE NEW.resident_id IS NOT OLD.resident_id OR NEW.kind IS NOT OLD.kind
     OR NEW.plate IS NOT OLD.plate OR NEW.zone_code IS NOT OLD.zone_code
     OR NEW.valid_from IS NOT OLD.valid_from OR NEW.valid_to IS NOT OLD.valid_to;
END;

CREATE TRIGGER permit_status_rules
BEFORE UPDATE OF status ON permit
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: permit_status_flow: this status change is not allowed (pending_payment -> active/cancelled, active -> suspended/cancelled, suspended -> active/cancelled)')
  WHERE CASE OLD.status
          WHEN 'pending_payment' THEN NEW.status NOT IN ('active', 'cancelled')
          WHEN 'active' THEN NEW.status NOT IN ('suspended', 'cancelled')
          WHEN 'suspended' THEN NEW.status NOT IN ('active', 'cancelled')
          ELSE 1
        END;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: activate_when_paid: a permit becomes active only once it is paid in full')
  WHERE NEW.status = 'active' AND round(NEW.amount_paid, 2) < round(NEW.fee, 2);
END;

-- ============================================================================ payments

CREATE TRIGGER payment_rules
BEFORE INSERT ON payment
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cash_monthly_limit: at most 150.00 EUR in cash per resident per calendar month')
  WHERE NEW.method = 'cash'
    AND EXISTS (SELECT 1 FROM permit WHERE permit_id = NEW.permit_id)
    AND round((SELECT COALESCE(SUM(pay.amount), 0)
               FROM payment pay JOIN permit p ON p.permit_id = pay.permit_id
               WHERE pay.method = 'cash'
                 AND p.resident_id = (SELECT resident_id FROM permit WHERE permit_id = NEW.permit_id)
                 AND strftime('%Y-%m', pay.paid_on)
                     = strftime('%Y-%m', (SELECT business_date FROM desk_calendar))) + NEW.amount, 2) > 150;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: no_overpayment: the payments on a permit cannot exceed its fee')
  WHERE round((SELECT COALESCE(SUM(amount), 0) FROM payment WHERE permit_id = NEW.permit_id) + NEW.amount, 2)
        > (SELECT round(fee, 2) FROM permit WHERE permit_id = NEW.permit_id);
END;

CREATE TRIGGER payment_after_insert
AFTER INSERT ON payment
BEGIN
  -- The payment is dated today, added to the permit's amount_paid, and a pending permit paid in full becomes active
  UPDATE payment SET paid_on = (SELECT business_date FROM desk_calendar) WHERE payment_id = NEW.payment_id;
  UPDATE permit
  SET amount_paid = round(amount_paid + NEW.amount, 2),
      status = CASE WHEN status = 'pending_payment' AND round(amount_paid + NEW.amount, 2) >= round(fee, 2)
                    THEN 'active' ELSE status END
  WHERE permit_id = NEW.permit_id;
END;

-- ============================================================================ fines

CREATE TRIGGER fine_status_rules
BEFORE UPDATE OF status ON fine
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: appeal_window: only an open fine can be appealed, within 28 days of its issue date; the desk makes no other change to a fine')
  WHERE OLD.status <> 'open' OR NEW.status <> 'appealed'
     OR julianday((SELECT business_date FROM desk_calendar)) - julianday(OLD.issued_on) > 28;
END;
