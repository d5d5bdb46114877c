CREATE TABLE settings ( -- counter settings read by the triggers
  settings_id INTEGER PRIMARY KEY CHECK (settings_id = 1),
  today TEXT NOT NULL -- YYYY-MM-DD
);

CREATE TABLE customer ( -- registered customers
  customer_id TEXT PRIMARY KEY NOT NULL, -- e.g. C-101
  full_name TEXT NOT NULL,
  licence_class TEXT NOT NULL CHECK (licence_class IN ('B', 'C')),
  loyalty TEXT NOT NULL DEFAULT 'standard' CHECK (loyalty IN ('standard', 'gold')),
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'banned')),
  strikes INTEGER NOT NULL DEFAULT 0 CHECK (strikes >= 0)
);

CREATE TABLE branch ( -- rental branches
  branch_id TEXT PRIMARY KEY NOT NULL,
  city TEXT NOT NULL
);

CREATE TABLE car ( -- the fleet
  car_id TEXT PRIMARY KEY NOT NULL, -- plate number
  branch_id TEXT NOT NULL REFERENCES branch(branch_id),
  model TEXT NOT NULL,
  category TEXT NOT NULL CHECK (category IN ('compact', 'suv', 'van')),
  daily_rate REAL NOT NULL CHECK (daily_rate > 0), -- EUR per day
  status TEXT NOT NULL DEFAULT 'available' CHECK (status IN ('available', 'rented', 'workshop'))
);

CREATE TABLE rental ( -- bookings of one car by one customer
  rental_id INTEGER PRIMARY KEY,
  customer_id TEXT NOT NULL REFERENCES customer(customer_id),
  car_id TEXT NOT NULL REFERENCES car(car_id),
  start_date TEXT NOT NULL, -- YYYY-MM-DD
  days INTEGER NOT NULL CHECK (days > 0),
  extras INTEGER NOT NULL DEFAULT 0 CHECK (extras >= 0), -- child seats, roof boxes, ...
  status TEXT NOT NULL DEFAULT 'booked' CHECK (status IN ('booked', 'picked_up', 'returned', 'cancelled')),
  total_price REAL -- set from the car's daily rate
);

CREATE TABLE damage_report ( -- damage found at return
  report_id INTEGER PRIMARY KEY,
  rental_id INTEGER NOT NULL REFERENCES rental(rental_id),
  severity TEXT NOT NULL CHECK (severity IN ('minor', 'major')),
  cost REAL NOT NULL CONSTRAINT damage_cost_positive CHECK (cost > 0)
);

CREATE TABLE ledger ( -- journal written by the triggers
  entry_id INTEGER PRIMARY KEY,
  note TEXT NOT NULL
);

CREATE TRIGGER rental_booking_rules
BEFORE INSERT ON rental
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: customer_in_good_standing: only active customers can book')
  WHERE (SELECT status FROM customer WHERE customer_id = NEW.customer_id) IS NOT 'active';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: strike_limit: customers with 3 or more strikes cannot book')
  WHERE (SELECT strikes FROM customer WHERE customer_id = NEW.customer_id) >= 3;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: open_rental_limit: a customer can hold at most 2 open rentals')
  WHERE (SELECT COUNT(*) FROM rental WHERE customer_id = NEW.customer_id
         AND status IN ('booked', 'picked_up')) >= 2;
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: car_free: the car is not available')
  WHERE (SELECT status FROM car WHERE car_id = NEW.car_id) IS NOT 'available';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: van_licence: vans need a class C licence')
  WHERE (SELECT category FROM car WHERE car_id = NEW.car_id) = 'van'
    AND (SELECT licence_class FROM customer WHERE customer_id = NEW.customer_id) <> 'C';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: start_not_past: a rental cannot start before today')
  WHERE julianday(NEW.start_date) IS NULL OR NEW.start_date < (SELECT today FROM settings);
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: new_rental_booked: new rentals are created booked')
  WHERE NEW.status IS NOT 'booked';
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: rental_length: a rental lasts 1 to 14 days (21 for gold customers)')
  WHERE NEW.days > 21
     OR (NEW.days > 14 AND (SELECT loyalty FROM customer WHERE customer_id = NEW.customer_id) <> 'gold');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: extras_limit: at most 3 extras per rental')
  WHERE NEW.extras > 3;
END;

CREATE TRIGGER rental_after_booking
AFTER INSERT ON rental
BEGIN
  -- The car is marked rented, the price is set from its daily rate, and the booking is journaled
  UPDATE car SET status = 'rented' WHERE car_id = NEW.car_id;
  UPDATE rental SET total_price = NEW.days * (SELECT daily_rate FROM car WHERE car_id = NEW.car_id)
  WHERE rental_id = NEW.rental_id;
  INSERT INTO ledger (note) VALUES ('booked ' || NEW.car_id || ' for ' || NEW.customer_id);
END;

CREATE TRIGGER rental_final
BEFORE UPDATE ON rental
WHEN OLD.status IN ('returned', 'cancelled') AND (NEW.total_price IS OLD.total_price)
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: final_rental: a returned or cancelled rental cannot change');
END;

CREATE TRIGGER rental_change_rules
BEFORE UPDATE OF days, extras ON rental
WHEN NEW.days IS NOT OLD.days OR NEW.extras IS NOT OLD.extras
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: rental_length: a rental lasts 1 to 14 days (21 for gold customers)')
  WHERE NEW.days > 21
     OR (NEW.days > 14 AND (SELECT loyalty FROM customer WHERE customer_id = NEW.customer_id) <> 'gold');
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: extras_limit: at most 3 extras per rental')
  WHERE NEW.extras > 3;
END;

CREATE TRIGGER rental_status_rules
BEFORE UPDATE OF status ON rental
WHEN NEW.status IS NOT OLD.status AND OLD.status NOT IN ('returned', 'cancelled')
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: status_flow: booked rentals are picked up or cancelled, picked-up rentals are returned')
  WHERE NOT ((OLD.status = 'booked' AND NEW.status IN ('picked_up', 'cancelled'))
          OR (OLD.status = 'picked_up' AND NEW.status = 'returned'));
END;

CREATE TRIGGER rental_after_change
AFTER UPDATE OF days ON rental
WHEN NEW.days IS NOT OLD.days
BEGIN
  -- The price follows the new length
  UPDATE rental SET total_price = NEW.days * (SELECT daily_rate FROM car WHERE car_id = NEW.car_id)
  WHERE rental_id = NEW.rental_id;
END;

CREATE TRIGGER rental_after_close
AFTER UPDATE OF status ON rental
WHEN NEW.status IN ('returned', 'cancelled') AND OLD.status IS NOT NEW.status
BEGIN
  -- The car becomes available again and the closing is journaled
  UPDATE car SET status = 'available' WHERE car_id = NEW.car_id;
  INSERT INTO ledger (note) VALUES (NEW.status || ' rental of ' || NEW.car_id);
END;

CREATE TRIGGER damage_rules
BEFORE INSERT ON damage_report
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: damage_needs_pickup: damage is reported on picked-up or returned rentals only')
  WHERE (SELECT status FROM rental WHERE rental_id = NEW.rental_id) NOT IN ('picked_up', 'returned');
END;

CREATE TRIGGER damage_after_insert
AFTER INSERT ON damage_report
WHEN NEW.severity = 'major'
BEGIN
  -- A major damage adds a strike to the customer
  UPDATE customer SET strikes = strikes + 1
  WHERE customer_id = (SELECT customer_id FROM rental WHERE rental_id = NEW.rental_id);
END;
