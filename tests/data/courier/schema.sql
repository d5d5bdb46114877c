-- Swiftline Couriers customer service desk: tables (static constraints) first, then the triggers
-- that compile the desk policy (policy.md). Money is GBP; dates are YYYY-MM-DD.

CREATE TABLE ops_day ( -- the simulated operations date (one row), read by the triggers
  ops_day_id INTEGER PRIMARY KEY CHECK (ops_day_id = 1),
  current_day TEXT NOT NULL -- today, YYYY-MM-DD
);

CREATE TABLE depot ( -- Swiftline depots: origin of shipments and base of the pickup drivers
  depot_code TEXT PRIMARY KEY NOT NULL, -- e.g. MAN1
  city TEXT NOT NULL, -- city the depot serves, e.g. Manchester
  pickups_per_window INTEGER NOT NULL CHECK (pickups_per_window > 0) -- scheduled pickups the depot takes per date and window
);

CREATE TABLE account ( -- customer accounts (companies and private senders)
  account_no TEXT PRIMARY KEY NOT NULL, -- e.g. AC-30418
  holder_name TEXT NOT NULL, -- company or person, e.g. Bloom & Petal Florists
  tier TEXT NOT NULL CHECK (tier IN ('standard', 'business', 'enterprise')), -- sets the COD limit and high-value permission
  city TEXT NOT NULL, -- city of the account's premises
  contact_email TEXT,
  is_on_stop BOOLEAN NOT NULL DEFAULT 0 -- 1 = overdue invoice: no bookings until the stop is lifted
);

CREATE TABLE shipment ( -- consignments: one origin depot, one destination address
  tracking_no TEXT PRIMARY KEY NOT NULL, -- e.g. SL-7Q2M-1022
  account_no TEXT NOT NULL REFERENCES account(account_no), -- sender
  service TEXT NOT NULL CHECK (service IN ('economy', 'express', 'same_day')), -- economy = road, express = flown next day, same_day = van within one city
  origin_depot TEXT NOT NULL REFERENCES depot(depot_code), -- depot the shipment leaves from
  dest_name TEXT NOT NULL, -- recipient name
  dest_street TEXT NOT NULL, -- recipient street address
  dest_city TEXT NOT NULL, -- recipient city
  dest_postcode TEXT NOT NULL, -- recipient postcode, e.g. LS1 4DY
  declared_value REAL NOT NULL CHECK (declared_value >= 0), -- GBP value of the goods; the most that claims can pay
  cod_amount REAL NOT NULL DEFAULT 0 CHECK (cod_amount >= 0), -- GBP cash to collect on delivery; 0 = no COD
  charge REAL, -- GBP price, computed by the system (base per service plus weight surcharges)
  booked_on TEXT, -- booking date, set by the system
  status TEXT NOT NULL DEFAULT 'booked'
    CHECK (status IN ('booked', 'in_transit', 'delivered', 'returned', 'lost', 'cancelled')),
  delivered_on TEXT -- delivery date, set by the drivers' system
);

CREATE TABLE parcel ( -- the parcels of a shipment, numbered 1, 2, 3... within it
  tracking_no TEXT NOT NULL REFERENCES shipment(tracking_no),
  parcel_no INTEGER NOT NULL CHECK (parcel_no BETWEEN 1 AND 5), -- number within the shipment
  weight_kg REAL NOT NULL CHECK (weight_kg > 0), -- weight in kilograms
  description TEXT, -- contents, e.g. brake discs
  has_lithium BOOLEAN NOT NULL DEFAULT 0, -- 1 = contains lithium batteries (not flown)
  is_fragile BOOLEAN NOT NULL DEFAULT 0, -- 1 = handle with care label
  PRIMARY KEY (tracking_no, parcel_no)
);

CREATE TABLE pickup ( -- driver collections at the customer's premises
  pickup_ref TEXT PRIMARY KEY NOT NULL, -- e.g. PU-250522-014
  account_no TEXT NOT NULL REFERENCES account(account_no),
  depot_code TEXT NOT NULL REFERENCES depot(depot_code), -- depot sending the driver
  pickup_date TEXT NOT NULL CHECK (date(pickup_date) IS pickup_date), -- YYYY-MM-DD
  time_window TEXT NOT NULL CHECK (time_window IN ('am', 'pm')), -- am = 08:00-12:00, pm = 13:00-17:00
  status TEXT NOT NULL DEFAULT 'scheduled' CHECK (status IN ('scheduled', 'collected', 'cancelled'))
);

CREATE TABLE claim ( -- compensation claims on shipments
  claim_id INTEGER PRIMARY KEY,
  tracking_no TEXT NOT NULL REFERENCES shipment(tracking_no),
  kind TEXT NOT NULL CHECK (kind IN ('damage', 'loss', 'delay')),
  amount REAL NOT NULL CHECK (amount > 0), -- GBP claimed
  details TEXT, -- what happened, in the customer's words
  filed_on TEXT, -- set by the system to today
  status TEXT NOT NULL DEFAULT 'submitted' CHECK (status IN ('submitted', 'approved', 'rejected')) -- decided by the claims team
);

CREATE TABLE ledger ( -- account ledger written by the system: charges (positive) and refunds (negative)
  entry_id INTEGER PRIMARY KEY,
  account_no TEXT NOT NULL REFERENCES account(account_no),
  tracking_no TEXT REFERENCES shipment(tracking_no),
  entry_type TEXT NOT NULL CHECK (entry_type IN ('charge', 'surcharge', 'refund')),
  amount REAL NOT NULL, -- GBP; refunds are negative
  posted_on TEXT NOT NULL -- YYYY-MM-DD
);

-- ============================================================================ shipments

CREATE TRIGGER shipment_booking_rules
BEFORE INSERT ON shipment
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: shipment_status_flow: a new shipment is created as booked')
  WHERE NEW.status IS NOT 'booked';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: account_on_stop: accounts on stop cannot book shipments or pickups')
  WHERE (SELECT is_on_stop FROM account WHERE account_no = NEW.account_no) IS NOT 0;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: insurance_cap: only business and enterprise accounts can declare more than 2500.00 GBP')
  WHERE NEW.declared_value > 2500
    AND (SELECT tier FROM account WHERE account_no = NEW.account_no) NOT IN ('business', 'enterprise');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: same_day_local: same-day shipments stay within the city of the origin depot')
  WHERE NEW.service = 'same_day'
    AND lower(trim(NEW.dest_city)) IS NOT (SELECT lower(city) FROM depot WHERE depot_code = NEW.origin_depot);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cod_monthly_cap: COD this calendar month would exceed the tier limit (standard 500, business 2000, enterprise 10000 GBP)')
  WHERE NEW.cod_amount > 0
    AND round((SELECT COALESCE(SUM(s.cod_amount), 0) FROM shipment s
               WHERE s.account_no = NEW.account_no AND s.status <> 'cancelled'
                 AND strftime('%Y-%m', s.booked_on) = strftime('%Y-%m', (SELECT current_day FROM ops_day)))
              + NEW.cod_amount, 2)
        > (SELECT CASE tier WHEN 'standard' THEN 500 WHEN 'business' THEN 2000 ELSE 10000 END
           FROM account WHERE account_no = NEW.account_no);
END;

CREATE TRIGGER shipment_after_booking
AFTER INSERT ON shipment
BEGIN
  -- The base charge of the service is set, the booking is dated today and the charge is posted to the account's ledger
  UPDATE shipment
  SET charge = CASE NEW.service WHEN 'economy' THEN 6.90 WHEN 'express' THEN 14.50 ELSE 29.00 END,
      booked_on = (SELECT current_day FROM ops_day)
  WHERE tracking_no = NEW.tracking_no;
  INSERT INTO ledger (account_no, tracking_no, entry_type, amount, posted_on)
  VALUES (NEW.account_no, NEW.tracking_no, 'charge',
          CASE NEW.service WHEN 'economy' THEN 6.90 WHEN 'express' THEN 14.50 ELSE 29.00 END,
          (SELECT current_day FROM ops_day));
END;

CREATE TRIGGER shipment_fixed_fields
BEFORE UPDATE OF account_no, service, origin_depot ON shipment
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: shipment_status_flow: the account, service and origin of a shipment never change')
  WHERE NEW.account_no IS NOT OLD.account_no OR NEW.service IS NOT OLD.service
     OR NEW.origin_depot IS NOT OLD.origin_depot;
END;

CREATE TRIGGER shipment_value_change_rules
BEFORE UPDATE OF declared_value, cod_amount ON shipment
WHEN NEW.declared_value IS NOT OLD.declared_value OR NEW.cod_amount IS NOT OLD.cod_amount
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: redirect_before_dispatch: the declared value and COD amount change only while the shipment is booked')
  WHERE OLD.status <> 'booked';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: insurance_cap: only business and enterprise accounts can declare more than 2500.00 GBP')
  WHERE NEW.declared_value > 2500
    AND (SELECT tier FROM account WHERE account_no = NEW.account_no) NOT IN ('business', 'enterprise');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: cod_monthly_cap: COD in the calendar month of the booking would exceed the tier limit (standard 500, business 2000, enterprise 10000 GBP)')
  WHERE NEW.cod_amount > OLD.cod_amount
    AND round((SELECT COALESCE(SUM(s.cod_amount), 0) FROM shipment s
               WHERE s.account_no = OLD.account_no AND s.status <> 'cancelled' AND s.tracking_no <> OLD.tracking_no
                 AND strftime('%Y-%m', s.booked_on) = strftime('%Y-%m', OLD.booked_on))
              + NEW.cod_amount, 2)
        > (SELECT CASE tier WHEN 'standard' THEN 500 WHEN 'business' THEN 2000 ELSE 10000 END
           FROM account WHERE account_no = OLD.account_no);
END;

CREATE TRIGGER shipment_redirect_rules
BEFORE UPDATE OF dest_name, dest_street, dest_city, dest_postcode ON shipment
WHEN NEW.dest_name IS NOT OLD.dest_name OR NEW.dest_street IS NOT OLD.dest_street
  OR NEW.dest_city IS NOT OLD.dest_city OR NEW.dest_postcode IS NOT OLD.dest_postcode
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: redirect_before_dispatch: the destination changes only while the shipment is booked, and a same-day shipment stays in its city')
  WHERE OLD.status <> 'booked'
     OR (OLD.service = 'same_day' AND lower(trim(NEW.dest_city)) IS NOT lower(trim(OLD.dest_city)));
END;

CREATE TRIGGER shipment_status_rules
BEFORE UPDATE OF status ON shipment
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: shipment_status_flow: booked -> in_transit or cancelled; in_transit -> delivered, returned or lost; other statuses are final')
  WHERE CASE OLD.status
          WHEN 'booked' THEN NEW.status NOT IN ('in_transit', 'cancelled')
          WHEN 'in_transit' THEN NEW.status NOT IN ('delivered', 'returned', 'lost')
          ELSE 1
        END;
END;

CREATE TRIGGER shipment_after_cancel
AFTER UPDATE OF status ON shipment
WHEN NEW.status = 'cancelled' AND OLD.status = 'booked'
BEGIN
  -- The whole charge (base and surcharges) is refunded to the account's ledger
  INSERT INTO ledger (account_no, tracking_no, entry_type, amount, posted_on)
  VALUES (NEW.account_no, NEW.tracking_no, 'refund', -NEW.charge, (SELECT current_day FROM ops_day));
END;

-- ============================================================================ parcels

CREATE TRIGGER parcel_rules
BEFORE INSERT ON parcel
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: parcel_limit: parcels are added only to booked shipments, at most 5 per shipment')
  WHERE (SELECT status FROM shipment WHERE tracking_no = NEW.tracking_no) IS NOT 'booked'
     OR (SELECT COUNT(*) FROM parcel WHERE tracking_no = NEW.tracking_no) >= 5;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: parcel_weight: a parcel weighs at most 30 kg by economy, 20 kg by express, 10 kg by same-day')
  WHERE NEW.weight_kg > (SELECT CASE service WHEN 'economy' THEN 30 WHEN 'express' THEN 20 ELSE 10 END
                         FROM shipment WHERE tracking_no = NEW.tracking_no);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: lithium_by_road: parcels with lithium batteries cannot go by express')
  WHERE NEW.has_lithium = 1
    AND (SELECT service FROM shipment WHERE tracking_no = NEW.tracking_no) = 'express';
END;

CREATE TRIGGER parcel_fixed
BEFORE UPDATE OF weight_kg, has_lithium ON parcel
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: parcel_weight: the weight and lithium flag of a parcel cannot change; add a new parcel')
  WHERE NEW.weight_kg IS NOT OLD.weight_kg OR NEW.has_lithium IS NOT OLD.has_lithium;
END;

CREATE TRIGGER parcel_after_insert
AFTER INSERT ON parcel
BEGIN
  -- The weight surcharge of the service is added to the shipment's charge and posted to the ledger
  UPDATE shipment
  SET charge = round(charge + NEW.weight_kg * CASE service WHEN 'economy' THEN 0.40 WHEN 'express' THEN 0.90 ELSE 1.20 END, 2)
  WHERE tracking_no = NEW.tracking_no;
  INSERT INTO ledger (account_no, tracking_no, entry_type, amount, posted_on)
  SELECT s.account_no, s.tracking_no, 'surcharge',
         round(NEW.weight_kg * CASE s.service WHEN 'economy' THEN 0.40 WHEN 'express' THEN 0.90 ELSE 1.20 END, 2),
         (SELECT current_day FROM ops_day)
  FROM shipment s WHERE s.tracking_no = NEW.tracking_no;
END;

-- ============================================================================ pickups

CREATE TRIGGER pickup_rules
BEFORE INSERT ON pickup
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pickup_cancel_notice: new pickups are scheduled')
  WHERE NEW.status IS NOT 'scheduled';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: account_on_stop: accounts on stop cannot book shipments or pickups')
  WHERE (SELECT is_on_stop FROM account WHERE account_no = NEW.account_no) IS NOT 0;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pickup_lead_time: pickups are booked from tomorrow up to 14 days ahead, never on a Sunday')
  WHERE julianday(NEW.pickup_date) - julianday((SELECT current_day FROM ops_day)) NOT BETWEEN 1 AND 14
     OR strftime('%w', NEW.pickup_date) = '0';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: one_pickup_per_day: the account already has a scheduled pickup on this date')
  WHERE EXISTS (SELECT 1 FROM pickup WHERE account_no = NEW.account_no
                AND pickup_date = NEW.pickup_date AND status = 'scheduled');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pickup_capacity: the depot has no pickup left in this window')
  WHERE (SELECT COUNT(*) FROM pickup WHERE depot_code = NEW.depot_code AND pickup_date = NEW.pickup_date
         AND time_window = NEW.time_window AND status = 'scheduled')
        >= (SELECT pickups_per_window FROM depot WHERE depot_code = NEW.depot_code);
END;

CREATE TRIGGER pickup_change_rules
BEFORE UPDATE ON pickup
WHEN NEW.status IS NOT OLD.status OR NEW.pickup_date IS NOT OLD.pickup_date
  OR NEW.time_window IS NOT OLD.time_window OR NEW.depot_code IS NOT OLD.depot_code
  OR NEW.account_no IS NOT OLD.account_no
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: pickup_cancel_notice: a scheduled pickup can only be cancelled, up to the day before its date')
  WHERE OLD.status <> 'scheduled' OR NEW.status IS NOT 'cancelled'
     OR NEW.pickup_date IS NOT OLD.pickup_date OR NEW.time_window IS NOT OLD.time_window
     OR NEW.depot_code IS NOT OLD.depot_code OR NEW.account_no IS NOT OLD.account_no
     OR OLD.pickup_date <= (SELECT current_day FROM ops_day);
END;

-- ============================================================================ claims

CREATE TRIGGER claim_rules
BEFORE INSERT ON claim
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: claim_eligibility: loss claims need a lost shipment; damage claims a delivery in the last 30 days; delay claims an express or same-day delivery in the last 30 days')
  WHERE NEW.status IS NOT 'submitted'
     OR (SELECT CASE NEW.kind
                  WHEN 'loss' THEN s.status <> 'lost'
                  WHEN 'damage' THEN s.status <> 'delivered'
                       OR julianday(o.current_day) - julianday(s.delivered_on) > 30
                  ELSE s.status <> 'delivered' OR s.service = 'economy'
                       OR julianday(o.current_day) - julianday(s.delivered_on) > 30
                END
         FROM shipment s, ops_day o WHERE s.tracking_no = NEW.tracking_no);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: claim_amount_cap: claims on a shipment cannot exceed its declared value; a delay claim cannot exceed the charge')
  WHERE round((SELECT COALESCE(SUM(amount), 0) FROM claim
               WHERE tracking_no = NEW.tracking_no AND status <> 'rejected') + NEW.amount, 2)
        > (SELECT declared_value FROM shipment WHERE tracking_no = NEW.tracking_no)
     OR (NEW.kind = 'delay' AND NEW.amount > (SELECT charge FROM shipment WHERE tracking_no = NEW.tracking_no));
END;

CREATE TRIGGER claim_after_insert
AFTER INSERT ON claim
BEGIN
  -- the claim is dated today
  UPDATE claim SET filed_on = (SELECT current_day FROM ops_day) WHERE claim_id = NEW.claim_id;
END;
