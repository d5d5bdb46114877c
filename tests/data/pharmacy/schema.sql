CREATE TABLE today ( -- the simulated current date, read by the triggers
  today_id INTEGER PRIMARY KEY CHECK (today_id = 1),
  day TEXT NOT NULL -- YYYY-MM-DD
);

CREATE TABLE insurance_plan ( -- insurance plans and what they cover
  plan_code TEXT NOT NULL PRIMARY KEY, -- self_pay, basic or premium
  name TEXT NOT NULL,
  copay_rate REAL NOT NULL CHECK (copay_rate BETWEEN 0 AND 1), -- share of the price the patient pays
  annual_cap REAL NOT NULL CHECK (annual_cap >= 0) -- claims the plan pays per calendar year
);

CREATE TABLE patient ( -- pharmacy patients
  patient_id TEXT NOT NULL PRIMARY KEY, -- e.g. PT-1001
  name TEXT NOT NULL,
  date_of_birth TEXT NOT NULL, -- YYYY-MM-DD
  phone TEXT,
  plan_code TEXT NOT NULL REFERENCES insurance_plan(plan_code),
  member_number TEXT -- insurance member number; empty for self-pay patients
);

CREATE TABLE drug ( -- drugs on the pharmacy's formulary with their stock
  drug_id TEXT NOT NULL PRIMARY KEY, -- NDC code, e.g. NDC-0093-3147
  name TEXT NOT NULL,
  strength TEXT NOT NULL,
  form TEXT NOT NULL CHECK (form IN ('tablet', 'capsule', 'inhaler', 'pen')),
  controlled BOOLEAN NOT NULL DEFAULT 0, -- 1 for a controlled substance
  stock INTEGER NOT NULL CHECK (stock >= 0), -- units on hand
  unit_price REAL NOT NULL CHECK (unit_price > 0)
);

CREATE TABLE prescription ( -- prescriptions received from prescribers
  rx_id TEXT NOT NULL PRIMARY KEY, -- e.g. RX-2001
  patient_id TEXT NOT NULL REFERENCES patient(patient_id),
  drug_id TEXT NOT NULL REFERENCES drug(drug_id),
  prescriber TEXT NOT NULL,
  quantity INTEGER NOT NULL CHECK (quantity > 0), -- units per fill as written
  refills_left INTEGER NOT NULL CHECK (refills_left >= 0), -- fills still allowed
  status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'cancelled', 'expired')),
  written_on TEXT NOT NULL,
  expires_on TEXT NOT NULL -- last day the prescription can be filled
);

CREATE TABLE dispensing ( -- fills: units of a prescription handed to the patient
  fill_id INTEGER PRIMARY KEY,
  rx_id TEXT NOT NULL REFERENCES prescription(rx_id),
  quantity INTEGER NOT NULL, -- units dispensed
  filled_on TEXT, -- set to today when the fill is recorded
  copay REAL NOT NULL DEFAULT 0 -- what the patient paid, computed from the plan
);

CREATE TABLE claim ( -- insurance claims for fills
  claim_id INTEGER PRIMARY KEY,
  fill_id INTEGER NOT NULL REFERENCES dispensing(fill_id),
  amount REAL NOT NULL DEFAULT 0, -- billed to the plan: fill price minus copay
  status TEXT NOT NULL DEFAULT 'submitted' CHECK (status IN ('submitted', 'paid', 'rejected')),
  submitted_on TEXT
);

-- Filling a prescription
CREATE TRIGGER dispensing_rules
BEFORE INSERT ON dispensing
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: rx_fillable: only active prescriptions can be filled')
  WHERE (SELECT status FROM prescription WHERE rx_id = NEW.rx_id) <> 'active';

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: rx_not_expired: a prescription cannot be filled after its expiry date')
  WHERE (SELECT expires_on FROM prescription WHERE rx_id = NEW.rx_id) < (SELECT day FROM today);

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: refills_remaining: a prescription with no refills left cannot be filled')
  WHERE (SELECT refills_left FROM prescription WHERE rx_id = NEW.rx_id) < 1;

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: fill_quantity: a fill is at least 1 unit and at most the prescribed quantity')
  WHERE NEW.quantity < 1
     OR NEW.quantity > (SELECT quantity FROM prescription WHERE rx_id = NEW.rx_id);

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: plan_quantity_limit: a single fill is at most 30 units on the basic plan and 90 on the premium plan')
  WHERE NEW.quantity > CASE (SELECT pa.plan_code
                             FROM patient pa JOIN prescription r ON r.patient_id = pa.patient_id
                             WHERE r.rx_id = NEW.rx_id)
                         WHEN 'basic' THEN 30
                         WHEN 'premium' THEN 90
                         ELSE NEW.quantity
                       END;

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: refill_too_soon: a prescription can be filled again only 21 days after its previous fill')
  WHERE julianday((SELECT day FROM today))
        - julianday((SELECT MAX(filled_on) FROM dispensing WHERE rx_id = NEW.rx_id)) < 21;

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: in_stock: the pharmacy must have enough units of the drug in stock')
  WHERE NEW.quantity > (SELECT dr.stock
                        FROM drug dr JOIN prescription r ON r.drug_id = dr.drug_id
                        WHERE r.rx_id = NEW.rx_id);

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: controlled_fill_cap: at most 2 fills of controlled substances per patient in 30 days')
  WHERE EXISTS (SELECT 1 FROM prescription r JOIN drug dr ON dr.drug_id = r.drug_id
                WHERE r.rx_id = NEW.rx_id AND dr.controlled = 1)
    AND (SELECT COUNT(*)
         FROM dispensing f
         JOIN prescription r ON r.rx_id = f.rx_id
         JOIN drug dr ON dr.drug_id = r.drug_id
         WHERE dr.controlled = 1
           AND r.patient_id = (SELECT patient_id FROM prescription WHERE rx_id = NEW.rx_id)
           AND f.filled_on > date((SELECT day FROM today), '-30 days')) >= 2;
END;

CREATE TRIGGER dispensing_after_fill
AFTER INSERT ON dispensing
BEGIN
  -- The fill is dated today, the copay is computed from the patient's plan, the units leave stock and the prescription uses one refill
  UPDATE dispensing
  SET filled_on = (SELECT day FROM today),
      copay = ROUND(NEW.quantity
                    * (SELECT dr.unit_price FROM drug dr JOIN prescription r ON r.drug_id = dr.drug_id
                       WHERE r.rx_id = NEW.rx_id)
                    * (SELECT p.copay_rate FROM insurance_plan p
                       JOIN patient pa ON pa.plan_code = p.plan_code
                       JOIN prescription r ON r.patient_id = pa.patient_id
                       WHERE r.rx_id = NEW.rx_id), 2)
  WHERE fill_id = NEW.fill_id;
  UPDATE drug SET stock = stock - NEW.quantity
  WHERE drug_id = (SELECT drug_id FROM prescription WHERE rx_id = NEW.rx_id);
  UPDATE prescription SET refills_left = refills_left - 1 WHERE rx_id = NEW.rx_id;
END;

-- Prescriptions
CREATE TRIGGER prescription_status_flow
BEFORE UPDATE OF status ON prescription
WHEN NEW.status IS NOT OLD.status
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: rx_status_flow: only an active prescription can change status, and only to cancelled or expired')
  WHERE OLD.status <> 'active' OR NEW.status NOT IN ('cancelled', 'expired');
END;

CREATE TRIGGER prescription_terms_fixed
BEFORE UPDATE OF patient_id, drug_id, quantity, prescriber, written_on, expires_on ON prescription
WHEN NEW.patient_id IS NOT OLD.patient_id
  OR NEW.drug_id IS NOT OLD.drug_id
  OR NEW.quantity IS NOT OLD.quantity
  OR NEW.prescriber IS NOT OLD.prescriber
  OR NEW.written_on IS NOT OLD.written_on
  OR NEW.expires_on IS NOT OLD.expires_on
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: rx_terms_fixed: the patient, drug, quantity, prescriber and dates of a prescription cannot be changed');
END;

-- Insurance claims
CREATE TRIGGER claim_rules
BEFORE INSERT ON claim
BEGIN
  SELECT RAISE(ABORT, 'POLICY_VIOLATION: claim_once: a fill can be claimed only once unless its earlier claims were rejected')
  WHERE EXISTS (SELECT 1 FROM claim WHERE fill_id = NEW.fill_id AND status <> 'rejected');

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: insured_only: fills of self-pay patients cannot be claimed')
  WHERE (SELECT pa.plan_code
         FROM dispensing f
         JOIN prescription r ON r.rx_id = f.rx_id
         JOIN patient pa ON pa.patient_id = r.patient_id
         WHERE f.fill_id = NEW.fill_id) = 'self_pay';

  SELECT RAISE(ABORT, 'POLICY_VIOLATION: annual_benefit_cap: the claims of a patient in a calendar year cannot exceed the annual benefit of their plan')
  WHERE (SELECT COALESCE(SUM(c.amount), 0)
         FROM claim c
         JOIN dispensing f ON f.fill_id = c.fill_id
         JOIN prescription r ON r.rx_id = f.rx_id
         WHERE c.status <> 'rejected'
           AND strftime('%Y', c.submitted_on) = strftime('%Y', (SELECT day FROM today))
           AND r.patient_id = (SELECT r2.patient_id FROM dispensing f2
                               JOIN prescription r2 ON r2.rx_id = f2.rx_id
                               WHERE f2.fill_id = NEW.fill_id))
      + (SELECT f.quantity * dr.unit_price - f.copay
         FROM dispensing f
         JOIN prescription r ON r.rx_id = f.rx_id
         JOIN drug dr ON dr.drug_id = r.drug_id
         WHERE f.fill_id = NEW.fill_id)
      > (SELECT p.annual_cap
         FROM insurance_plan p
         JOIN patient pa ON pa.plan_code = p.plan_code
         JOIN prescription r ON r.patient_id = pa.patient_id
         JOIN dispensing f ON f.rx_id = r.rx_id
         WHERE f.fill_id = NEW.fill_id);
END;

CREATE TRIGGER claim_after_submit
AFTER INSERT ON claim
BEGIN
  -- The claim is billed for the fill's price minus the patient's copay, dated today and marked submitted
  UPDATE claim
  SET amount = (SELECT ROUND(f.quantity * dr.unit_price - f.copay, 2)
                FROM dispensing f
                JOIN prescription r ON r.rx_id = f.rx_id
                JOIN drug dr ON dr.drug_id = r.drug_id
                WHERE f.fill_id = NEW.fill_id),
      status = 'submitted',
      submitted_on = (SELECT day FROM today)
  WHERE claim_id = NEW.claim_id;
END;
